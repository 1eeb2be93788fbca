"""The completion scripts of ``memscope completion``, one renderer per shell, from the command
tree memscope.cli.completion reads out of the parsers. Each script is static text: nothing runs
memscope while completing."""

from __future__ import annotations

import re

from memscope.cli.completion import Command, Option

_GLOBS = {"db": "*.db", "py": "*.py", "pickle": "*.pickle"}


# -- bash ------------------------------------------------------------------------------------------


def _bash_case(rows: list[tuple[list[str], str]]) -> str:
    """``case`` arms: patterns (already quoted) -> the word echoed."""
    return "\n".join(f"        {'|'.join(pats)}) echo {word} ;;" for pats, word in rows if pats)


def _bash_word(kind: str | None, choices: list[str]) -> str:
    if kind == "choices":
        return "'=" + " ".join(choices) + "'"
    return kind or "none"


def bash(tree: list[Command], version: str) -> str:
    names = " ".join(c.name for c in tree)
    options = [([c.name], "'" + " ".join(f for o in c.options for f in o.flags) + "'") for c in tree]
    values: list[tuple[list[str], str]] = []
    positions: list[tuple[list[str], str]] = []
    for c in tree:
        for o in c.options:
            if o.value is not None:
                values.append(([f'"{c.name} {f}"' for f in o.flags], _bash_word(o.value, o.choices)))
        for i, (kind, choices, _metavar) in enumerate(c.positionals, 1):
            positions.append(([f'"{c.name} {i}"'], _bash_word(kind, choices)))
        if c.many and c.positionals:
            kind, choices, _metavar = c.positionals[-1]
            positions.append(([f'"{c.name} "*'], _bash_word(kind, choices)))
        elif c.rest:
            positions.append(([f'"{c.name} "*'], "rest"))
    ends = [f'"{c.name} {f}"' for c in tree for f in c.ends]
    return f"""# bash completion for memscope (memscope completion bash; memscope {version})
# Now: source <(memscope completion bash)
# For good: memscope completion bash > ~/.local/share/bash-completion/completions/memscope

_memscope_options() {{  # $1: a command; its options
    case $1 in
{_bash_case(options)}
    esac
}}

_memscope_value() {{  # $1 $2: a command and one of its options; what the option's value completes
    case "$1 $2" in
{_bash_case(values)}
    esac
}}

_memscope_positional() {{  # $1 $2: a command and an argument's place (1: its first); what it completes
    case "$1 $2" in
{_bash_case(positions)}
    esac
}}

_memscope_ends() {{  # $1 $2: the option whose value the script's own words follow
    case "$1 $2" in
        {'|'.join(ends) or '"-"'}) return 0 ;;
    esac
    return 1
}}

_memscope_complete() {{  # $1: what to complete (a kind, or =WORDS), $2: the word so far
    local IFS=$'\\n'
    case $1 in
        =*) IFS=' ' read -r -a words <<< "${{1#=}}"
            mapfile -t COMPREPLY < <(compgen -W "${{words[*]}}" -- "$2") ;;
        file|rest) mapfile -t COMPREPLY < <(compgen -f -- "$2"); compopt -o filenames 2>/dev/null ;;
        dir) mapfile -t COMPREPLY < <(compgen -d -- "$2"); compopt -o filenames 2>/dev/null ;;
        db|py|pickle)
            mapfile -t COMPREPLY < <(compgen -f -X "!*.$1" -- "$2"; compgen -d -- "$2")
            compopt -o filenames 2>/dev/null ;;
        *) COMPREPLY=() ;;
    esac
}}

_memscope() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} cmd="" word option="" i skip=0 npos=0 rest=0
    COMPREPLY=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${{COMP_WORDS[i]}}
        if [[ $word == "=" ]]; then skip=1; continue; fi  # --option=value: bash splits at the =
        if ((skip)); then
            skip=0
            if _memscope_ends "$cmd" "$option"; then rest=1; break; fi
            continue
        fi
        if [[ -z $cmd ]]; then
            [[ $word != -* ]] && cmd=$word
            continue
        fi
        if [[ $word == -- ]]; then rest=1; break; fi
        if [[ $word == -* ]]; then
            option=$word
            [[ -n $(_memscope_value "$cmd" "$word") ]] && skip=1
            continue
        fi
        npos=$((npos + 1))
        if [[ $(_memscope_positional "$cmd" $((npos + 1))) == rest ]]; then rest=1; break; fi
    done
    [[ $cur == "=" ]] && cur=""
    if [[ -z $cmd ]]; then
        if [[ $cur == -* ]]; then
            mapfile -t COMPREPLY < <(compgen -W "-h --help --version" -- "$cur")
        else
            mapfile -t COMPREPLY < <(compgen -W "{names}" -- "$cur")
        fi
    elif ((rest)); then
        _memscope_complete file "$cur"
    elif ((skip)); then
        option=${{COMP_WORDS[COMP_CWORD - 1]}}
        [[ $option == "=" ]] && option=${{COMP_WORDS[COMP_CWORD - 2]}}
        _memscope_complete "$(_memscope_value "$cmd" "$option")" "$cur"
    elif [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$(_memscope_options "$cmd")" -- "$cur")
    else
        _memscope_complete "$(_memscope_positional "$cmd" $((npos + 1)))" "$cur"
    fi
}}

complete -F _memscope memscope
"""


# -- zsh -------------------------------------------------------------------------------------------


def _zsh_text(text: str, limit: int = 90) -> str:
    """Help text inside a single-quoted ``_arguments`` description: no quote, bracket, colon or
    backslash, one clause, bounded."""
    text = text.split("; ")[0]
    text = re.sub(r"[\[\]:'\\`$]", "", text)
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _zsh_action(kind: str | None, choices: list[str]) -> str:
    if kind == "choices":
        return "(" + " ".join(choices) + ")"
    if kind in _GLOBS:
        return f'_files -g "{_GLOBS[kind]}"'
    return {"file": "_files", "rest": "_files", "dir": "_files -/"}.get(kind or "", " ")


def _zsh_message(metavar: str) -> str:
    return re.sub(r"[^\w.\-]", "", metavar) or "value"


def _zsh_option(o: Option) -> str:
    desc = _zsh_text(o.help)
    if o.value is None:
        names = [f for f in o.flags]
    else:  # -o VALUE or -oVALUE; --db VALUE or --db=VALUE
        names = [f + ("+" if not f.startswith("--") else "=") for f in o.flags]
    exclusive = f"({' '.join(o.flags)})" if len(o.flags) > 1 else ""
    if "--help" in o.flags or "--version" in o.flags:
        exclusive = "(- *)"
    spec = f"[{desc}]"
    if o.value is not None:
        spec += f":{_zsh_message(o.metavar)}:{_zsh_action(o.value, o.choices)}"
    if len(names) == 1:
        return f"'{exclusive}{names[0]}{spec}'"
    return f"'{exclusive}'{{{','.join(names)}}}'{spec}'"


def zsh(tree: list[Command], version: str) -> str:
    commands = "\n".join(f"        '{c.name}:{_zsh_text(c.help, 200)}'" for c in tree)
    arms = []
    for c in tree:
        specs = [_zsh_option(o) for o in c.options]
        for i, (kind, choices, metavar) in enumerate(c.positionals, 1):
            star = c.many and i == len(c.positionals)
            where = "*" if star else str(i)
            specs.append(f"'{where}:{_zsh_message(metavar)}:{_zsh_action(kind, choices)}'")
        if c.rest:
            specs.append("'*::arguments of the script:_files'")
        body = " \\\n                ".join(specs)
        arms.append(f"            ({c.name})\n"
                    f"                _arguments -s -S : \\\n                {body} && ret=0 ;;")
    cases = "\n".join(arms)
    return f"""#compdef memscope
# zsh completion for memscope (memscope completion zsh; memscope {version})
# Now (after compinit): source <(memscope completion zsh)
# For good: memscope completion zsh > "${{fpath[1]}}/_memscope"

_memscope() {{
    local curcontext="$curcontext" state state_descr line ret=1
    typeset -A opt_args
    _arguments -C \\
        '(- *)'{{-h,--help}}'[show the help]' \\
        '(- *)--version[print memscope'"'"'s version]' \\
        '1: :->command' \\
        '*:: :->argument' && ret=0
    case $state in
    command)
        local -a commands
        commands=(
{commands}
        )
        _describe -t commands 'memscope command' commands && ret=0
        ;;
    argument)
        curcontext="${{curcontext%:*:*}}:memscope-$words[1]:"
        case $words[1] in
{cases}
        esac
        ;;
    esac
    return ret
}}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _memscope "$@"
else
    compdef _memscope memscope
fi
"""


# -- fish ------------------------------------------------------------------------------------------


def _fish_text(text: str, limit: int = 90) -> str:
    text = text.split("; ")[0]
    text = text if len(text) <= limit else text[:limit - 1].rstrip() + "…"
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_value(kind: str | None, choices: list[str]) -> str:
    if kind == "choices":
        return "-x -a " + _fish_text(" ".join(choices), 10_000)
    if kind in _GLOBS:
        return f"-x -a '(__memscope_files {_GLOBS[kind][2:]})'"
    if kind == "dir":
        return "-x -a '(__fish_complete_directories)'"
    if kind in ("file", "rest"):
        return "-r -F"
    return "-x"


def fish(tree: list[Command], version: str) -> str:
    lines = [f"# fish completion for memscope (memscope completion fish; memscope {version})",
             "# Now: memscope completion fish | source",
             "# For good: memscope completion fish > ~/.config/fish/completions/memscope.fish",
             "function __memscope_files --argument-names suffix  # those files, and directories to go into",
             "    set -l token (commandline -ct)",
             "    __fish_complete_path \"$token\" | string match -r -- \"^.*(?:\\\\.$suffix|/)\\t.*\\$\"",
             "end",
             "complete -c memscope -e",
             "complete -c memscope -f",
             "complete -c memscope -n __fish_use_subcommand -s h -l help -d 'show the help'",
             "complete -c memscope -n __fish_use_subcommand -l version -d \"print memscope's version\""]
    for c in tree:
        lines.append(f"complete -c memscope -n __fish_use_subcommand -a {c.name} -d {_fish_text(c.help)}")
    for c in tree:
        when = f"-n '__fish_seen_subcommand_from {c.name}'"
        for o in c.options:
            value = "" if o.value is None else " " + _fish_value(o.value, o.choices)
            shorts = [f[1:] for f in o.flags if not f.startswith("--")]
            longs = [f[2:] for f in o.flags if f.startswith("--")]
            first = True
            for long in longs or [""]:
                names = (f" -s {shorts[0]}" if shorts and first else "") + (f" -l {long}" if long else "")
                if not names:
                    continue
                lines.append(f"complete -c memscope {when}{names}{value} -d {_fish_text(o.help)}")
                first = False
        if c.rest:  # the script, then its own words: any file
            lines.append(f"complete -c memscope {when} -F")
            continue
        done: set[str] = set()
        for kind, choices, _metavar in c.positionals:
            if kind == "choices":
                lines.append(f"complete -c memscope {when} -a {_fish_text(' '.join(choices), 10_000)}")
            elif kind in _GLOBS and kind not in done:
                lines.append(f"complete -c memscope {when} -a '(__memscope_files {_GLOBS[kind][2:]})'")
            done.add(kind)
    return "\n".join(lines) + "\n"

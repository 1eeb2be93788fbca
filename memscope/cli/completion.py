"""``memscope completion bash|zsh|fish``: a shell completion script, made from the real parsers.

Every command, every option (with its aliases) and what each value completes come from the
argparse parsers the commands register (memscope.cli.build_parser), so a new option completes
without anything written here. What a value or an argument completes is read from its metavar:
``RUN.db``, ``A.db``, ``NODE.db`` and attach's ``PATH`` complete ``.db`` files, ``SCRIPT.py``
``.py`` files, ``SNAPSHOT.pickle`` ``.pickle`` files, ``DIR`` directories, other file names
(``OUT.html``, ``TRACE.json``, ``DIR_OR_FILE``) any file, a ``choices`` list its words, and a
number or a size nothing. After the script of ``attach``, ``estimate``, ``fit`` and ``whatif``
every word is the script's own, completed as a file. ``attach`` parses its script, ``-m MODULE``
and ``-- COMMAND`` by hand (memscope.cli.attach.split): those are added here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

HELP = "print a shell completion script (bash, zsh or fish) for memscope's commands and options"
SHELLS = ("bash", "zsh", "fish")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS,
                        help="the shell: bash (source <(memscope completion bash)), zsh or fish")


@dataclass
class Option:
    flags: list[str]  # every name of the option, the long ones after the short
    value: str | None  # what its value completes (see _kind); None: it takes no value
    choices: list[str]
    help: str
    metavar: str


@dataclass
class Command:
    name: str
    help: str
    options: list[Option]
    positionals: list[tuple[str, list[str], str]]  # (kind, choices, metavar) in order
    many: bool = False  # the last positional repeats (merge's NODE.db ...)
    rest: bool = False  # after the positionals, every word is the script's own (a file)
    ends: list[str] = field(default_factory=list)  # options whose value is followed by the script's words


def _kind(action: argparse.Action) -> str:
    """What a value completes: db, py, pickle (those files and directories), file (any file),
    dir, choices, none."""
    if action.choices:
        return "choices"
    metavar = str(action.metavar or action.dest)
    upper = metavar.upper()
    if upper.endswith(".DB") or metavar == "PATH":
        return "db"
    if upper.endswith(".PY"):
        return "py"
    if upper.endswith(".PICKLE"):
        return "pickle"
    if upper == "DIR":
        return "dir"
    if "." in metavar or "FILE" in upper or "DIR" in upper:
        return "file"
    return "none"


def _help(action: argparse.Action) -> str:
    text = " ".join(str(action.help or "").split())
    return text.replace("%(default)s", str(action.default))


def command_tree() -> list[Command]:
    """Every command of ``memscope --help``, as its parser has it."""
    from memscope.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: str(a.help or "") for a in sub._choices_actions}
    out: list[Command] = []
    for name, p in sub.choices.items():
        cmd = Command(name, helps.get(name, ""), [], [])
        for action in p._actions:
            if action.help == argparse.SUPPRESS:
                continue
            if action.option_strings:
                flags = sorted(action.option_strings, key=lambda f: (f.startswith("--"), 0))
                value = None if action.nargs == 0 else _kind(action)
                cmd.options.append(Option(flags, value, [str(c) for c in action.choices or []], _help(action),
                                          str(action.metavar or action.dest.upper())))
            elif action.nargs == argparse.REMAINDER:
                cmd.rest = True
            else:
                cmd.positionals.append((_kind(action), [str(c) for c in action.choices or []],
                                        str(action.metavar or action.dest)))
                cmd.many = action.nargs in ("+", "*")
        if name == "attach":  # attach.split: SCRIPT.py [ARGS], -m MODULE [ARGS], -- COMMAND [ARGS]
            cmd.positionals.append(("py", [], "SCRIPT.py"))
            cmd.rest = True
            cmd.options.append(Option(["-m"], "none", [], "run a module (python -m MODULE) with the agent", "MODULE"))
            cmd.ends.append("-m")
        out.append(cmd)
    return out


def run(args: argparse.Namespace) -> int:
    from memscope import __version__
    from memscope.cli import completion_shells

    render = {"bash": completion_shells.bash, "zsh": completion_shells.zsh, "fish": completion_shells.fish}
    print(render[args.shell](command_tree(), __version__), end="")
    return 0

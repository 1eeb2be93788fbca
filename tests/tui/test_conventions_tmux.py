"""Issue 38's conventions on a real terminal (tmux, 80x24): the progress line drawn in place while a
command runs and erased before its output, and nothing of it when stdout is piped, with --json
or -q; Ctrl-C ends memscope with 130 with or without a dashboard (the key in the dashboard, a
SIGINT sent to it, a terminal's ^C to a headless attach whose training dies of it); NO_COLOR
greys the dashboard; the zsh completion script completes in a real zsh."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

from memscope.cli.completion import command_tree
from memscope.cli.completion_shells import zsh as zsh_script
from test_attach_tmux import ROOT, Pane, pane, run_status  # noqa: F401 (pane: the fixture)

PY = shlex.quote(sys.executable)
ENV = f"cd {shlex.quote(str(ROOT))} && OMP_NUM_THREADS=1 PYTHONPATH={shlex.quote(os.environ.get('PYTHONPATH', ''))}"
PROGRESS = re.compile(r"^memscope (\w+) · (\d+) s(: .*)?$")


def shell_line(command: str) -> str:
    return f"{ENV} {command}; echo MEMSCOPE_EXIT=$?; sleep 600"


def restart(term: Pane, command: str) -> None:
    """``command``'s shell line in the pane, on a cleared screen (the pane's command before it killed)."""
    try:
        term.tmux("has-session", "-t", "t")
    except Exception:  # noqa: BLE001 - no server yet
        term.start(shell_line(command))
        return
    term.tmux("respawn-pane", "-k", "-t", "t", f"clear; {shell_line(command)}")
    term.tmux("clear-history", "-t", "t")


def watch(term: Pane, command: str, timeout: float = 120.0) -> tuple[list[tuple[int, str]], str]:
    """Run ``command`` in the pane, sampling the screen until it exits: every progress line seen
    (its screen row and text), and the last screen."""
    restart(term, command)
    term.wait_for(lambda s: "MEMSCOPE_EXIT=" not in s, what="a cleared screen")
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout
    while True:
        screen = term.screen()
        seen += [(row, line.rstrip()) for row, line in enumerate(screen.splitlines())
                 if PROGRESS.match(line.rstrip())]
        if "MEMSCOPE_EXIT=" in screen:
            return seen, screen
        assert time.monotonic() < deadline, screen
        time.sleep(0.1)


def test_progress_on_a_terminal_and_none_when_piped(pane: Pane) -> None:  # noqa: F811
    slow = "tests/scripts/slow_start.py"
    seen, screen = watch(pane, f"{PY} -m memscope estimate {slow} --sleep 2.2")
    assert "MEMSCOPE_EXIT=0" in screen and "allocator peak" in screen, screen
    texts = {text for _row, text in seen}
    rows = {row for row, _text in seen}
    seconds = {int(PROGRESS.match(t).group(2)) for t in texts}  # type: ignore[union-attr]
    # one line, redrawn in place each second while the fake run waits, saying what runs
    assert len(rows) == 1 and len(seconds) >= 2 and min(seconds) >= 1, seen
    assert all(re.match(rf"memscope estimate · \d s: a fake run of {slow}", t) for t in texts), texts
    assert not any(PROGRESS.match(line.rstrip()) for line in screen.splitlines())  # erased at the end
    assert screen.index("allocator peak") < screen.index("MEMSCOPE_EXIT=0")
    # top --once samples for its window: the line on the terminal; none when stdout is a pipe,
    # with --json or with -q (the same command, on the same terminal)
    once = f"{PY} -m memscope top --once --window 1.8"
    seen, screen = watch(pane, once)
    assert "MEMSCOPE_EXIT=0" in screen and {PROGRESS.match(t).group(1) for _r, t in seen} == {"top"}, seen  # type: ignore[union-attr]
    for variant, output in ((f"{once} | cat", "torch process"), (f"{once} --json", '"as_root": '),
                            (f"{once} -q", "torch process")):
        seen, screen = watch(pane, variant)
        assert "MEMSCOPE_EXIT=0" in screen and seen == [], (variant, seen)
        assert output in screen, screen  # its output, whole


def test_ctrl_c_exits_130_with_and_without_a_dashboard(pane: Pane, tmp_path: Path) -> None:  # noqa: F811
    run = "tests/tui/data/leaky.sqlite"
    # the dashboard, NO_COLOR set: drawn in greys; ctrl+c, the key, quits with 130
    restart(pane, f"NO_COLOR=1 {PY} -m memscope tui {run}")
    pane.wait_for(lambda s: "1 Overview" in s and "finished" in s, what="the dashboard")
    colours = _colours(pane.tmux("capture-pane", "-p", "-e", "-t", "t"))
    assert colours and all(_grey(c) for c in colours), colours
    pane.keys("C-c")
    assert "MEMSCOPE_EXIT=130" in pane.wait_for(lambda s: "MEMSCOPE_EXIT=" in s, what="memscope to exit")
    # without NO_COLOR it has colours; a SIGINT sent to it (kill -INT) quits with 130 too
    restart(pane, f"{PY} -m memscope tui {run}")
    pane.wait_for(lambda s: "1 Overview" in s and "finished" in s, what="the dashboard")
    assert not all(_grey(c) for c in _colours(pane.tmux("capture-pane", "-p", "-e", "-t", "t")))
    os.kill(_python_child(pane), signal.SIGINT)
    assert "MEMSCOPE_EXIT=130" in pane.wait_for(lambda s: "MEMSCOPE_EXIT=" in s, what="memscope to exit")
    # a headless attach, ^C from the terminal: the training dies of it (no torch._dynamo imported:
    # no optimizer), and its 130 is memscope's (the dashboard's ctrl+c: test_attach_tmux)
    db = tmp_path / "loop.db"
    restart(pane, (f"{PY} -m memscope attach --headless --db {db} tests/scripts/loop.py --mode backward "
                   "--steps 2000 --sleep 0.05"))
    deadline = time.monotonic() + 120
    while not (db.exists() and _steps(db) >= 2):
        assert time.monotonic() < deadline, pane.screen()
        time.sleep(0.2)
    pane.keys("C-c")
    screen = pane.wait_for(lambda s: "MEMSCOPE_EXIT=" in s, what="memscope to exit")
    assert "MEMSCOPE_EXIT=130" in screen and run_status(db)[0] == "interrupted", screen


def test_zsh_completes_in_a_real_zsh(pane: Pane, tmp_path: Path) -> None:  # noqa: F811
    zsh = shutil.which("zsh")
    assert zsh is not None, "zsh is not installed (make test-deps installs it from Debian)"
    (tmp_path / "_memscope").write_text(zsh_script(command_tree(), "test"))
    (tmp_path / "run.db").write_text("")
    (tmp_path / "notes.txt").write_text("")
    setup = ("PS1='> '; autoload -U compinit; compinit -u -D; source _memscope; memscope() { :; }; "
             "zstyle ':completion:*' list-prompt ''")
    pane.start(f"cd {shlex.quote(str(tmp_path))} && env -i HOME={shlex.quote(str(tmp_path))} TERM=xterm "
               f"PATH=/usr/bin:/bin {zsh} -f -i")
    pane.wait_for(lambda s: "#" in s or "%" in s or ">" in s, what="zsh's prompt")
    pane.tmux("send-keys", "-t", "t", "-l", setup)
    pane.keys("Enter")
    pane.wait_for(lambda s: s.rstrip().endswith(">"), what="the prompt after the setup")
    for typed, completed in (("memscope rep", "memscope report "), ("memscope report --j", "memscope report --json "),
                             ("memscope report r", "memscope report run.db "),
                             ("memscope report --html n", "memscope report --html notes.txt "),
                             ("memscope attach --debugger l", "memscope attach --debugger lldb ")):
        pane.tmux("send-keys", "-t", "t", "-l", typed)
        pane.keys("Tab")
        pane.wait_for(lambda s, c=completed: f"> {c}".rstrip() in [ln.rstrip() for ln in s.splitlines()],
                      what=f"zsh to complete {typed!r}")
        pane.keys("C-u")


def _colours(escaped: str) -> list[tuple[int, ...]]:
    """The foreground and background colours of an escaped screen (SGR 38/48;5;N or ;2;R;G;B)."""
    out: list[tuple[int, ...]] = []
    for params in re.findall(r"\x1b\[([0-9;]*)m", escaped):
        p = [int(x) for x in params.split(";") if x]
        i = 0
        while i < len(p):
            if p[i] in (38, 48) and i + 2 < len(p) + 1 and p[i + 1:i + 2] == [5]:
                out.append((p[i + 2],))
                i += 3
            elif p[i] in (38, 48) and p[i + 1:i + 2] == [2]:
                out.append(tuple(p[i + 2:i + 5]))
                i += 5
            else:
                i += 1
    return out


def _grey(colour: tuple[int, ...]) -> bool:
    if len(colour) == 3:
        return colour[0] == colour[1] == colour[2]
    n = colour[0]
    if n in (0, 7, 8, 15) or n >= 232:
        return True
    if 16 <= n <= 231:
        r, g, b = (n - 16) // 36, (n - 16) // 6 % 6, (n - 16) % 6
        return r == g == b
    return False


def _python_child(term: Pane) -> int:
    """The memscope process the pane's shell runs."""
    shell = int(term.tmux("display", "-p", "-t", "t", "#{pane_pid}").strip())
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == shell:
                        return int(entry)
            except (OSError, ValueError, IndexError):
                continue
    raise AssertionError("no memscope process under the pane's shell")


def _steps(db: Path) -> int:
    try:
        return run_status(db)[1]
    except Exception:  # noqa: BLE001 - a file attach has only just created
        return 0


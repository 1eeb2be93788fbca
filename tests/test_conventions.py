"""What every command shares (issue 38, "Conventions"): ``--help`` and ``--version`` answered by
every command and every entry point; ``memscope completion bash|zsh|fish`` made from the real
parsers, its bash script sourced in a real bash and asked as bash's completion asks
(``COMP_WORDS``), its fish script asked by a real fish (``complete -C``), its zsh script
syntax-checked (the zsh script is completed for real in a terminal in
tests/tui/test_conventions_tmux.py); ``-o/--output`` as the alias of the file a command writes;
``-q`` hiding informational lines and nothing else; the progress line wired to what the commands
do (drawn on a terminal: tests/tui/test_conventions_tmux.py); a dashboard refusing a stdout that
is not a terminal; ``layers`` on a run of no step."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import ROOT, SCRIPTS, cli, memscope
from memscope import __version__
from memscope.cli import COMMANDS, build_parser, main, progress
from memscope.cli.completion import command_tree
from memscope.store.runs import create_run, finish_run

DATA = ROOT / "tests" / "data"
TUI_DATA = ROOT / "tests" / "tui" / "data"


def run_main(*args: str) -> tuple[int, str, str]:
    """``memscope ARGS`` in this process: exit status, stdout, stderr (argparse's exits too)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
    return code, out.getvalue(), err.getvalue()


def parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


# -- --help, --version --------------------------------------------------------------------------


def test_every_command_answers_help_and_version() -> None:
    assert set(parsers()) == set(COMMANDS)
    for name in COMMANDS:
        code, out, err = run_main(name, "--help")
        assert code == 0 and out.startswith(f"usage: memscope {name}") and "-q, --quiet" in out, (name, err)
        code, out, err = run_main(name, "--version")
        assert (code, out, err) == (0, f"memscope {__version__}\n", ""), name
    assert run_main("--version") == (0, f"memscope {__version__}\n", "")


def test_every_entry_point_answers_version() -> None:
    """``python -m memscope`` and the ``memscope`` console script, as separate processes."""
    script = shutil.which("memscope", path=str(Path(sys.executable).parent))
    assert script is not None, f"no memscope console script beside {sys.executable} (pip install -e .)"
    for argv in ([sys.executable, "-m", "memscope", "--version"], [script, "--version"],
                 [script, "report", "--version"]):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert (out.returncode, out.stdout, out.stderr) == (0, f"memscope {__version__}\n", ""), argv


# -- completion ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scripts() -> dict[str, str]:
    out: dict[str, str] = {}
    for shell in ("bash", "zsh", "fish"):
        code, text, err = run_main("completion", shell)
        assert code == 0 and err == "", err
        out[shell] = text
    return out


def test_completion_names_every_command_and_option(scripts: dict[str, str]) -> None:
    """Each script is made from the parsers: every command and every option string of each
    command's parser (aliases included) is in all three."""
    for name, parser in parsers().items():
        flags = [f for a in parser._actions if a.help != argparse.SUPPRESS for f in a.option_strings]
        assert "--version" in flags and "-q" in flags
        for shell, text in scripts.items():
            assert name in text, (shell, name)
            for flag in flags:
                word = flag.lstrip("-") if shell == "fish" else flag  # fish: -s o / -l output
                assert word in text, (shell, name, flag)
    tree = {c.name: c for c in command_tree()}
    assert [o.flags for o in tree["report"].options if "--html" in o.flags] == [["-o", "--html", "--output"]]
    assert tree["attach"].rest and tree["attach"].positionals[0][0] == "py" and tree["fit"].rest
    assert [k for k, _c, _m in tree["diff"].positionals] == ["db", "db"] and tree["merge"].many


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """A working directory to complete in (the scripts are written beside it, not in it)."""
    here = tmp_path / "here"
    (here / "sub").mkdir(parents=True)
    for name in ("a.db", "b.db", "train.py", "notes.txt", "snap.pickle"):
        (here / name).write_text("")
    return here


def test_bash_completes_as_bash_asks(scripts: dict[str, str], files: Path) -> None:
    """The script sourced in a real bash; each line of words is completed by the function bash
    calls on Tab (``complete -p`` names it), with COMP_WORDS / COMP_CWORD set as bash sets them
    (bash splits ``--html=x`` at the ``=``)."""
    bash = shutil.which("bash")
    assert bash is not None, "bash is not installed"
    cases = {
        "memscope rep": "report",
        "memscope report --j": "--json",
        "memscope ": " ".join(sorted(COMMANDS)),
        "memscope --v": "--version",
        "memscope report ": "a.db b.db sub",
        "memscope report --html ": "a.db b.db notes.txt snap.pickle sub train.py",
        "memscope report --html = ": "a.db b.db notes.txt snap.pickle sub train.py",
        "memscope report -o n": "notes.txt",
        "memscope diff a.db ": "a.db b.db sub",
        "memscope attach -o ": "a.db b.db sub",
        "memscope attach --debugger ": "auto gdb lldb",
        "memscope attach --sample-hz ": "",
        "memscope attach t": "train.py",
        "memscope attach train.py --j": "",  # the script's own options: not memscope's
        "memscope attach train.py n": "notes.txt",
        "memscope attach -m pkg.mod n": "notes.txt",
        "memscope estimate --optimizer sg": "sgd sgd-momentum",
        "memscope import ": "snap.pickle sub",
        "memscope merge out.db a.db ": "a.db b.db sub",
        "memscope whatif --db-dir ": "sub",
        "memscope completion ": "bash fish zsh",
        "memscope fit --gpu 24GiB train.py --batch n": "notes.txt",
    }
    script = files.parent / "memscope.bash"
    script.write_text(scripts["bash"])
    lines = [f"source {shlex.quote(str(script))}", "complete -p memscope"]
    for words in cases:
        split = words.split(" ")
        lines.append(f"COMP_WORDS=({' '.join(shlex.quote(w) for w in split)}); COMP_CWORD={len(split) - 1}; "
                     "COMPREPLY=(); _memscope; printf '%s\\n' \"=${COMPREPLY[*]}\"")
    out = subprocess.run([bash, "--norc", "--noprofile", "-c", "\n".join(lines)], cwd=files,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    said = out.stdout.splitlines()
    assert said[0] == "complete -F _memscope memscope"
    for (words, want), got in zip(cases.items(), said[1:], strict=True):
        assert sorted(got[1:].split()) == sorted(want.split()), (words, got)


def test_fish_completes_and_zsh_parses(scripts: dict[str, str], files: Path) -> None:
    fish, zsh = shutil.which("fish"), shutil.which("zsh")
    missing = [name for name, path in (("fish", fish), ("zsh", zsh)) if path is None]
    assert not missing, f"{' and '.join(missing)} not installed (make test-deps installs them from Debian)"
    assert fish is not None and zsh is not None
    (files.parent / "_memscope").write_text(scripts["zsh"])
    out = subprocess.run([zsh, "-n", str(files.parent / "_memscope")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    (files.parent / "memscope.fish").write_text(scripts["fish"])
    out = subprocess.run([fish, "-n", str(files.parent / "memscope.fish")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    cases = {"memscope rep": ["report"], "memscope report --j": ["--json"],
             "memscope report ": ["a.db", "b.db", "sub/"], "memscope import ": ["snap.pickle", "sub/"],
             "memscope completion ": ["bash", "fish", "zsh"], "memscope attach --debugger ": ["auto", "gdb", "lldb"],
             "memscope report -o n": ["notes.txt"], "memscope attach -o ": ["a.db", "b.db", "sub/"]}
    body = ["source ../memscope.fish"] + [f"complete -C {shlex.quote(w)}; echo ==" for w in cases]
    out = subprocess.run([fish, "--no-config", "-c", "\n".join(body)], cwd=files, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    answers = out.stdout.split("==\n")[:-1]
    for (words, want), got in zip(cases.items(), answers, strict=True):
        assert sorted(line.split("\t")[0] for line in got.splitlines()) == want, (words, got)


# -- -o/--output, -q/--quiet -----------------------------------------------------------------------


def test_output_is_the_file_the_command_writes(tmp_path: Path) -> None:
    from memscope.cli import _Parser
    from memscope.cli.attach import register, split
    from memscope.store.reader import RunReader

    page = tmp_path / "r.html"
    code, _out, err = run_main("report", str(TUI_DATA / "leaky.sqlite"), "-o", str(page))
    assert code == 0 and page.read_text().startswith("<!DOCTYPE html>") and "wrote" in err
    imported = tmp_path / "snap.db"
    code, _out, err = run_main("import", str(DATA / "cuda_snapshot_real.pickle"), "--output", str(imported))
    assert code == 0, err
    with RunReader(imported) as reader:
        assert reader.events("snapshot")
    parser = _Parser(prog="memscope attach")  # attach and attach --pid: the same parser
    register(parser)
    loop = str(SCRIPTS / "loop.py")
    for words in (["-o", "x.db", "--pid", "1"], ["--output=x.db", loop], ["--output", "x.db", loop, "-o", "y"],
                  ["--db", "x.db", "-m", "json.tool"]):
        options, command, _python = split(words)
        assert parser.parse_args(options).db == "x.db", words
        assert command is None or command[-2:] in (["-o", "y"], ["-m", "json.tool"], [sys.executable, loop]), words


@pytest.fixture(scope="module")
def no_torch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A script that never imports torch: attach records no process, and says why (a problem
    line, which -q keeps) after its summary line (information, which -q hides)."""
    where = tmp_path_factory.mktemp("quiet")
    script = where / "hello.py"
    script.write_text("print('hello from the script')\nimport sys\nprint('and its stderr', file=sys.stderr)\n")
    return script


@pytest.mark.parametrize("quiet", [False, True])
def test_quiet_hides_information_not_problems_nor_the_training(no_torch: Path, tmp_path: Path,
                                                               quiet: bool) -> None:
    db = tmp_path / "q.db"
    out = memscope("attach", *(["-q"] if quiet else []), "--headless", "-o", str(db), str(no_torch))
    assert out.returncode == 0 and db.exists(), out.stderr
    assert out.stdout == "hello from the script\n"
    assert "and its stderr" in out.stderr
    assert "memscope: recording empty" in out.stderr  # why the record is empty: always said
    assert (f"memscope: {db} · 0 steps" in out.stderr) is not quiet  # the summary: information
    page = tmp_path / "q.html"
    code, _out, err = run_main("report", str(db), "--html", str(page), *(["--quiet"] if quiet else []))
    assert code == 0 and page.exists() and (err == "") is quiet and ("memscope: wrote" in err) is not quiet
    code, _out, err = run_main("report", str(tmp_path / "missing.db"), "-q")
    assert code == 2 and err.startswith("memscope: error: ")  # errors: never hidden


# -- the progress line: what each command says (drawn: tests/tui/test_conventions_tmux.py) -----------


@pytest.fixture
def said(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Everything a command's progress line was told, the line enabled as on a terminal (and
    drawn into nothing)."""
    texts: list[str] = []

    class Recorded(progress.Progress):
        def __init__(self, label: str, **kw: Any) -> None:
            super().__init__(label, stream=io.StringIO(), first_after=3600)
            texts.append(label)

        def update(self, text: str) -> None:
            texts.append(text)
            super().update(text)

    monkeypatch.setattr(progress, "Progress", Recorded)
    monkeypatch.setattr(progress, "wanted", lambda json_output=False: not json_output and not progress.is_quiet())
    yield texts


def test_the_progress_line_is_told_what_each_command_does(said: list[str], tmp_path: Path) -> None:
    leaky = str(TUI_DATA / "leaky.sqlite")
    assert run_main("export", leaky, "--chrome", str(tmp_path / "t.json"), "--csv", str(tmp_path / "csv"))[0] == 0
    assert said[0] == "memscope export" and any(t.endswith(" events written") for t in said)
    assert any(t.startswith("0 of ") and "files written; writing " in t for t in said), said
    said.clear()
    assert run_main("import", str(DATA / "cuda_snapshot_real.pickle"), "-o", str(tmp_path / "s.db"))[0] == 0
    assert said == ["memscope import", f"reading {DATA / 'cuda_snapshot_real.pickle'}",
                    "summarising the segments and traces", f"writing {tmp_path / 's.db'}"]
    said.clear()
    assert run_main("report", leaky)[0] == 0
    assert said == ["memscope report", f"reading {leaky}"]
    said.clear()
    broken = tmp_path / "broken.py"  # whatif's baseline fails at once: what it said before it ran is enough
    broken.write_text("raise SystemExit(3)\n")
    code, _out, err = run_main("whatif", "--try", "mixed_precision", "--steps", "2", "--db-dir",
                               str(tmp_path / "w"), str(broken))
    assert code == 1 and "the baseline run failed (exit 3)" in err
    assert said == ["memscope whatif", "run 1 of 2: baseline, 2 steps"]
    said.clear()
    assert run_main("top", "--once", "--window", "0.1")[0] == 0
    assert said == ["memscope top", "sampling every 0.05 s for 0.1 s"]
    said.clear()
    assert run_main("report", leaky, "--json")[0] == 0  # --json: no progress line at all
    assert run_main("report", leaky, "-q")[0] == 0  # nor with -q
    assert run_main("completion", "bash")[0] == 0  # a script: never one
    assert run_main("export", leaky, "--csv", "-")[0] == 0  # the export itself on stdout: none
    assert said == []


def test_the_progress_line_on_a_terminal_is_erased_before_the_output() -> None:
    """The line itself, on a pseudo-terminal: drawn after ``first_after``, redrawn in place
    (``\\r`` and erase-to-end, one terminal line, never wrapped), erased before anything else is
    written; the command's output ends it."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))  # 60 columns
    term = os.fdopen(slave, "w")
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = term
    try:
        with progress.Progress("memscope test", stream=term, first_after=0.05, every=0.05) as p:
            p.update("step one " + "x" * 300)  # longer than the terminal: cut, not wrapped
            time.sleep(0.3)
            progress.info("memscope: an info line")
            time.sleep(0.2)
            print("the output")
            time.sleep(0.2)
            draws = p.draws
    finally:
        sys.stdout, sys.stderr = saved
        term.close()
    data = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    os.close(master)
    text = data.decode()
    assert draws >= 3
    before, _, after = text.partition("the output")
    assert re.search(r"\r\x1b\[Kmemscope test · \d s: step one xxx", before) and "memscope: an info line" in before
    info_at = before.index("memscope: an info line")
    assert before[:info_at].endswith("\r\x1b[K")  # erased before the info line
    assert before.endswith("\r\x1b[K")  # and before the output
    assert "memscope test" not in after  # nothing drawn under the output
    drawn = [d for d in before.split("\r\x1b[K") if d.startswith("memscope test")]
    assert drawn and all(len(d) < 60 and d.endswith("…") for d in drawn), drawn  # cut to one line


def test_fit_json_says_the_gpu_and_the_budget(tmp_path: Path) -> None:
    from memscope.analysis.fit import Allowance, document

    allowance = Allowance(300 << 20, 0.1)
    doc = document(24 << 30, 5, "--bs", [], allowance)
    assert doc["budget_bytes"] == doc["gpu_bytes"] == 24 << 30  # kept as it was: the GPU's size
    assert doc["tensor_budget_bytes"] == allowance.usable(24 << 30)
    assert doc["gpu_bytes"] - doc["cuda_context_bytes"] - doc["fragmentation_bytes"] == doc["tensor_budget_bytes"]
    assert doc["cuda_context_bytes"] == 300 << 20


# -- dashboards need a terminal; ^C ------------------------------------------------------------------


def test_the_dashboard_refuses_a_stdout_that_is_not_a_terminal(tmp_path: Path) -> None:
    """``memscope tui RUN.db > file``: one line, exit 2, the file left empty, and it ends."""
    run = str(TUI_DATA / "leaky.sqlite")
    out_file = tmp_path / "out.txt"
    with open(out_file, "w") as out:
        proc = subprocess.run([sys.executable, "-m", "memscope", "tui", run], stdout=out, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and out_file.read_text() == ""
    assert proc.stderr == (f"memscope: error: tui: the dashboard needs a terminal and stdout is not one; "
                           f"for text: memscope report {run}\n")
    code, _out, err = run_main("tui", str(tmp_path / "missing.db"))  # a bad file still says so first
    assert code == 2 and "no such file" in err


def test_ctrl_c_exits_130(tmp_path: Path) -> None:
    """A SIGINT to a command that is waiting (top --once sampling; estimate in its fake run,
    whose server is gone after it) ends it with 130 and no traceback; the daemon: 130 for SIGINT,
    0 for SIGTERM (a service manager's stop)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    slow = SCRIPTS / "slow_start.py"
    procs = {
        "top": subprocess.Popen([sys.executable, "-m", "memscope", "top", "--once", "--window", "60"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT),
        "estimate": subprocess.Popen([sys.executable, "-m", "memscope", "estimate", str(slow), "--sleep", "60"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=tmp_path),
        "daemon-int": subprocess.Popen([sys.executable, "-m", "memscope", "daemon", "-o", str(tmp_path / "n1.db"),
                                        "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env=env, cwd=tmp_path),
        "daemon-term": subprocess.Popen([sys.executable, "-m", "memscope", "daemon", "--db", str(tmp_path / "n2.db"),
                                         "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env, cwd=tmp_path),
    }
    try:
        deadline = time.monotonic() + 120
        server = None
        while True:  # the daemons have their node files, the fake run its trial (the script sleeps)
            assert time.monotonic() < deadline, {k: p.poll() for k, p in procs.items()}
            server = server or _child(procs["estimate"].pid, b"memscope.agent.fake.fakerun")
            if (server is not None and _child(server, b"") is not None
                    and (tmp_path / "n1.db").exists() and (tmp_path / "n2.db").exists()):
                break
            time.sleep(0.1)
        for name, proc in procs.items():
            proc.send_signal(signal.SIGTERM if name == "daemon-term" else signal.SIGINT)
        results = {name: (proc.wait(timeout=60), proc.stderr.read() if proc.stderr else "")
                   for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    assert {name: code for name, (code, _err) in results.items()} == {
        "top": 130, "estimate": 130, "daemon-int": 130, "daemon-term": 0}, results
    for _name, (_code, err) in results.items():
        assert "Traceback" not in err, err
    deadline = time.monotonic() + 10
    while _alive(server) and time.monotonic() < deadline:  # the fake-run server ended with it
        time.sleep(0.1)
    assert not _alive(server)


def _child(parent: int, marker: bytes) -> int | None:
    """A child process of ``parent`` whose command line has ``marker`` (the fake-run server:
    python -m memscope.agent.fake.fakerun; a trial it forked: any)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and any(marker in part for part in cmdline):
            return int(entry)
    return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- layers on a run of no step ----------------------------------------------------------------------


def test_layers_on_a_run_that_completed_no_step(tmp_path: Path) -> None:
    db = tmp_path / "none.db"
    create_run(str(db), ["python", "train.py"])
    finish_run(str(db), 0, None)
    out = cli("layers", str(db))
    assert out.returncode == 2 and "--layers-first" not in out.stderr
    assert out.stderr == (f"memscope: error: layers: {db} has no profiled step (it completed no training "
                          "step (a step ends at optimizer.step(), or at a backward without an optimizer), "
                          "so there was none to profile)\n")
    report = json.loads(cli("report", str(db), "--json").stdout)
    assert report["run"]["steps"] == 0

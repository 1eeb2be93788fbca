"""Run every reading command in-process on a file and say whether it behaved.

In-process (``memscope.cli.main``) because the fuzzer runs a few thousand commands: a
subprocess each would take minutes; a handful of real subprocess runs check the same in
tests/faults/test_corruption.py. A command behaves when it ends with exit 0, or with exit 2
and one ``memscope: error:`` line naming the file, with no traceback and no "internal error",
within the hang guard.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from memscope.cli import main

HANG_S = 60  # a command taking this long on a 100 KB file is hung (the machine may be loaded)


def commands(db: Path, other: Path, out: Path) -> list[list[str]]:
    """Every reading command, on ``db`` (``other``: a healthy run for diff; ``out``: scratch)."""
    d = str(db)
    return [
        ["report", d],
        ["report", d, "--json"],
        ["report", d, "--html", str(out / "r.html")],
        ["leaks", d],
        ["leaks", d, "--json"],
        ["oom", d],
        ["oom", d, "--json"],
        ["layers", d],
        ["layers", d, "--json", "--depth", "1"],
        ["export", d, "--chrome", "-"],
        ["export", d, "--csv", str(out / "csv")],
        ["diff", str(other), d],
        ["diff", d, str(other), "--json"],
    ]


@dataclass
class Outcome:
    argv: list[str]
    code: int | None
    out: str
    err: str
    problem: str | None  # None: behaved


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _guard(seconds: int) -> Iterator[None]:
    def fire(_signum: int, _frame: object) -> None:
        raise _Hang()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run(argv: list[str]) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    problem: str | None = None
    try:
        with _guard(HANG_S), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except _Hang:
        problem = f"hung for {HANG_S} s"
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - what main() let escape is the finding
        import traceback

        problem = "raised " + "".join(traceback.format_exception(exc))[-1500:]
    text = err.getvalue()
    if problem is None:
        if "Traceback" in text or "Traceback" in out.getvalue():
            problem = "printed a traceback"
        elif "internal error" in text:
            problem = "internal error: " + text.strip()[-800:]
        elif code not in (0, 2):
            problem = f"exit {code}"
        elif code == 2:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            if len(lines) != 1 or not lines[0].startswith("memscope: error: "):
                problem = f"exit 2 without one error line: {text[-400:]!r}"
    return Outcome(argv, code, out.getvalue(), text, problem)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""

"""Helpers for the fault tests that drive real ``memscope attach`` runs."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import ROOT, SCRIPTS, memscope

LOOP = str(SCRIPTS / "loop.py")


def start_attach(db: Path | str, *command: str, options: tuple[str, ...] = (),
                 cwd: Path | str = ROOT, env_extra: dict[str, str] | None = None,
                 **popen: Any) -> subprocess.Popen[str]:
    """``memscope attach --headless --db DB [options] COMMAND...`` in its own session (so a
    test can signal its process group as a terminal would)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    return subprocess.Popen([sys.executable, "-m", "memscope", "attach", "--headless", "--db",
                             str(db), *options, *command], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, **popen)


class Lock:
    """A real second connection holding BEGIN EXCLUSIVE on the run file."""

    def __init__(self, db: Path) -> None:
        self.conn = sqlite3.connect(db, isolation_level=None, timeout=30, check_same_thread=False)
        self.conn.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.close()


def listen(proc: subprocess.Popen[str], until: str) -> tuple[list[str], threading.Event]:
    """A thread reading ``proc``'s stderr, line by line, into the list until a line holds
    ``until`` (the event is set then)."""
    said: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            said.append(line)
            if until in line:
                seen.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return said, seen


def training_gone(supervisor: int) -> bool:
    """Whether attach's child (the training) has exited."""
    import psutil

    try:
        return not psutil.Process(supervisor).children()
    except psutil.Error:
        return True


def row(db: Path | str, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """One value from a live run file (None while it is not readable yet)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            found = conn.execute(sql, params).fetchone()
            return found[0] if found else None
        finally:
            conn.close()
    except sqlite3.Error:
        return None


def wait_until(predicate: Any, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def wait_steps(db: Path | str, n: int, proc: subprocess.Popen[str] | None = None) -> None:
    def reached() -> bool:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"attach ended early ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        return (row(db, "SELECT count(*) FROM steps") or 0) >= n

    wait_until(reached, what=f"{n} steps")


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def report(db: Path | str) -> dict[str, Any]:
    import json

    res = memscope("report", str(db), "--json")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout)


def text_report(db: Path | str) -> str:
    res = memscope("report", str(db))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    return res.stdout


def integrity(db: Path | str) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def steps_recorded(db: Path | str) -> list[int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute("SELECT step FROM steps ORDER BY step")]
    finally:
        conn.close()


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie nobody reaped yet is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A small tmpfs at ``where`` (skips the test where mounting is not allowed)."""
    where.mkdir(parents=True, exist_ok=True)
    res = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where))
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or 'not root'})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@contextlib.contextmanager
def bind(where: Path) -> Iterator[Any]:
    """The yielded function bind-mounts ``where`` over itself, read-only (call it once the run
    has opened its files); the context unmounts it.

    As root, chmod does not stop writes and ``mount -o remount,ro`` of a file system with files
    open for writing fails (busy). A bind mount made after the run opened its files is a new
    view with no writers: remounting it read-only leaves the open files writable and makes every
    new open (the supervisor's last write, the agent's goodbye) fail with EROFS, as on a
    directory that went read-only."""
    probe = where.parent / (where.name + "-probe")
    probe.mkdir()
    res = _mount("--bind", str(probe), str(probe))
    if res.returncode != 0:
        probe.rmdir()
        pytest.skip(f"cannot bind-mount here ({res.stderr.strip() or 'not root'})")
    subprocess.run(["umount", str(probe)], capture_output=True)
    probe.rmdir()

    def read_only() -> None:
        r = _mount("--bind", str(where), str(where))
        assert r.returncode == 0, r.stderr
        r = _mount("-o", "remount,bind,ro", str(where))
        assert r.returncode == 0, r.stderr

    try:
        yield read_only
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)

"""Real runs made once per test session and read by every test that only reads them, whichever
of make test's xdist workers runs it.

With ``--dist loadfile`` each worker is a process of its own, so a session-scoped fixture is made
once per worker: two files reading the same run on the two workers would attach it twice. Here a
run is made under a lock in a directory every worker of the session shares (the parent of the
worker's own base temporary directory, as pytest-xdist's documentation does it): the first
worker to ask attaches, the other waits for it and reads the same file. A run is keyed by its
whole command, so two fixtures share a file only when they would have run the same thing.

The file is read-only by agreement: a test that changes a run file copies it first.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

ROOT = Path(__file__).resolve().parent.parent


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This session's directory for shared runs, the same for all its xdist workers."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # .../pytest-N/popen-gwK -> .../pytest-N
    where = base / "shared-runs"
    where.mkdir(exist_ok=True)
    return where


def shared_attach(tmp_path_factory: pytest.TempPathFactory, options: Sequence[str], command: Sequence[str],
                  timeout: float = 300) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``memscope attach --headless --db RUN OPTIONS COMMAND`` run from the repository root, once
    per session: the run file and what the attach returned (exit status, stdout, stderr).
    ``command`` is the script and its arguments (paths relative to the root, as a user types them)."""
    key = "run-" + hashlib.sha256(json.dumps([*options, "--", *command]).encode()).hexdigest()[:12]
    where = shared_dir(tmp_path_factory)
    db = where / f"{key}.db"
    argv = [sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db), *options, *command]
    result = where / f"{key}.json"
    with open(where / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker making it: wait for it
        if not result.exists():
            for leftover in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
                leftover.unlink(missing_ok=True)  # from a worker that died mid-run
            env = dict(os.environ, OMP_NUM_THREADS="1")
            out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            # written last: a worker that died mid-run leaves no result, and the next one reruns
            tmp = result.with_suffix(".part")
            tmp.write_text(json.dumps([out.returncode, out.stdout, out.stderr]))
            tmp.replace(result)
        code, stdout, stderr = json.loads(result.read_text())
    return db, subprocess.CompletedProcess(argv, code, stdout, stderr)


def session_port(tmp_path_factory: pytest.TempPathFactory, name: str) -> int:
    """A rendezvous port picked once per session and kept in the shared directory, so that both
    xdist workers ask for the same command (a shared run is keyed by its command)."""
    where = shared_dir(tmp_path_factory)
    with open(where / f"{name}.port.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kept = where / f"{name}.port"
        if not kept.exists():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                kept.write_text(str(s.getsockname()[1]))
        return int(kept.read_text())


TORCHRUN = Path(sys.executable).parent / "torchrun"


def shared_ddp(tmp_path_factory: pytest.TempPathFactory, *script_args: str,
               timeout: float = 240) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``memscope attach --headless -- torchrun --nproc-per-node 2 ... tests/scripts/ddp.py
    SCRIPT_ARGS`` (gloo on CPU), once per session: the run files the ranks tests, the exports,
    the HTML page and the dashboard read (skips without torchrun)."""
    if not TORCHRUN.exists():
        pytest.skip("torchrun not installed beside this Python")
    port = session_port(tmp_path_factory, "ddp-" + "-".join(a.lstrip("-") for a in script_args))
    return shared_attach(tmp_path_factory, [], [
        "--", str(TORCHRUN), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
        "tests/scripts/ddp.py", *script_args], timeout=timeout)


LOOP_STEPS = 6


def shared_loop(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``memscope attach --headless`` of ``tests/scripts/loop.py --steps 6`` at default options,
    once per session: the finished run file of the tests that need one to read, or to copy and
    then change (an existing file that ``--force`` replaces, a file moved onto a live run's
    path, a -wal left beside it): tests/test_report_text.py, tests/test_sac_default.py,
    tests/test_bad_input.py, tests/faults/test_live_file.py. The run file and what the attach
    returned."""
    db, out = shared_attach(tmp_path_factory, [], ["tests/scripts/loop.py", "--steps", str(LOOP_STEPS)])
    assert out.returncode == 0, out.stderr
    return db, out

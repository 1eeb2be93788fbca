"""Signals reach the child once, exit statuses follow, and a live run file can be read."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS, report_json
from memscope.analysis.summary import summarize
from memscope.store.reader import RunReader


def start_attach(db: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db),
                             str(SCRIPTS / "loop.py"), *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_steps(db: Path, n: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.exists():
            try:
                with RunReader(db) as reader:
                    s = summarize(reader)
                    if s.steps >= n:
                        return {"summary": s, "procs": s.processes}
            except Exception:
                pass
        time.sleep(0.1)
    raise AssertionError(f"run never reached {n} steps")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_sent_to_memscope_reaches_the_child(run_db: Path, signum: int) -> None:
    proc = start_attach(run_db, "--steps", "1000", "--sleep", "0.05")
    try:
        wait_for_steps(run_db, 3)
        proc.send_signal(signum)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    stderr = proc.stderr.read() if proc.stderr else ""
    run = report_json(run_db)["run"]
    if signum == signal.SIGINT:
        # The script got exactly one KeyboardInterrupt (Python exits 1 from a script file)
        assert stderr.count("KeyboardInterrupt") == 1, stderr
        assert run["exit_code"] == proc.returncode == 1 and run["signal"] is None
    else:
        assert run["signal"] == 15 and proc.returncode == 128 + 15
    assert run["steps"] >= 3


def test_child_killed_from_outside(run_db: Path) -> None:
    proc = start_attach(run_db, "--steps", "1000", "--sleep", "0.05")
    try:
        live = wait_for_steps(run_db, 3)
        os.kill(live["procs"][0]["pid"], signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 137
    report = report_json(run_db)
    assert report["run"]["signal"] == 9 and report["run"]["steps"] >= 3


def test_reader_follows_a_live_run(run_db: Path) -> None:
    proc = start_attach(run_db, "--steps", "40", "--sleep", "0.05")
    try:
        first = wait_for_steps(run_db, 2)["summary"]
        assert first.status == "running" and first.ended is None
        later = wait_for_steps(run_db, first.steps + 5)["summary"]
        assert later.samples > first.samples
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert report_json(run_db)["run"]["steps"] == 40


def test_a_sampling_profiler_above_attach_changes_nothing(tmp_path: Path) -> None:
    """``py-spy record -- memscope attach ...`` (a user profiling the training's speed while memscope
    records its memory): py-spy stops and resumes the supervisor hundreds of times a second, and
    its wait woke with signal number 0. Forwarding that raised EINVAL: one line, the supervisor
    gone and the training killed with it (its death signal). Nothing is forwarded but the four
    signals a user sends."""
    spy = Path(sys.executable).parent / "py-spy"
    assert spy.exists(), f"py-spy is not installed beside {sys.executable} (pip install -e '.[test]')"
    db = tmp_path / "spied.db"
    out = subprocess.run([str(spy), "record", "--rate", "250", "--format", "raw", "-o", str(tmp_path / "p.txt"),
                          "--", sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db),
                          str(SCRIPTS / "loop.py"), "--steps", "150", "--sleep", "0.01"],
                         cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), text=True, capture_output=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr
    assert "memscope: error" not in out.stderr, out.stderr
    rep = report_json(db)
    assert (rep["run"]["status"], rep["run"]["steps"], rep["run"]["exit_code"]) == ("finished", 150, 0), rep["run"]

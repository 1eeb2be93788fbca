"""SIGKILL of the supervisor, of the training, of both, at several moments of a run.

The training never outlives ``memscope attach`` (the kernel's PR_SET_PDEATHSIG for its direct
child, the agent's watch on the supervisor for processes below it); a run nobody is left to
finish reads as ``abandoned``, not "still running", in the report and in the dashboard; a
killed training's status passes through; the file stays sound. Each test prints how many
seconds of memory samples the kill cost (the last sample in the file vs the moment of the kill).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from faults.runs import (LOOP, finish, integrity, pid_gone, report, row, start_attach, text_report,
                         wait_steps, wait_until)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SLOW_LOOP = (LOOP, "--steps", "400", "--sleep", "0.05")


def training_pid(attach: subprocess.Popen[str]) -> int:
    """The supervisor's child (the training), once started."""
    wait_until(lambda: psutil.Process(attach.pid).children(), timeout=60, what="the training")
    return psutil.Process(attach.pid).children()[0].pid


def samples_lost(db: Path, killed_at: float) -> float | None:
    last = row(db, "SELECT max(t) FROM samples")
    return None if last is None else round(killed_at - last, 3)


def assert_abandoned(db: Path) -> None:
    from memscope_tui.data import load_snapshot

    run = report(db)["run"]
    assert run["status"] == "abandoned", run
    assert any("abandoned" in note for note in run["recording"]), run
    text = text_report(db)
    assert "status    abandoned" in text and "still running" not in text, text
    assert load_snapshot(str(db)).summary.status == "abandoned"  # the dashboard stops polling
    assert integrity(db) == "ok"


@pytest.mark.parametrize("moment", ["starting", "training"])
def test_supervisor_killed(tmp_path: Path, moment: str) -> None:
    db = tmp_path / "run.db"
    attach = start_attach(db, *SLOW_LOOP)
    child = training_pid(attach)
    if moment == "training":
        wait_steps(db, 5, attach)
    killed_at = time.time()
    os.kill(attach.pid, signal.SIGKILL)
    attach.wait(timeout=30)
    wait_until(lambda: pid_gone(child), timeout=10, what="the training to die with its supervisor")
    print(f"\nsupervisor killed while {moment}: samples lost {samples_lost(db, killed_at)} s")
    assert_abandoned(db)


def test_training_killed(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    attach = start_attach(db, *SLOW_LOOP)
    wait_steps(db, 5, attach)
    child = training_pid(attach)
    killed_at = time.time()
    os.kill(child, signal.SIGKILL)
    code, _out, err = finish(attach)
    assert code == 137 and "Traceback" not in err, err  # 128 + SIGKILL, passed through
    lost = samples_lost(db, killed_at)
    print(f"\ntraining killed: samples lost {lost} s")
    run = report(db)["run"]
    assert run["status"] == "killed" and run["signal"] == 9 and run["steps"] >= 5
    assert integrity(db) == "ok" and not Path(str(db) + "-wal").exists()


def test_training_killed_while_starting(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    attach = start_attach(db, *SLOW_LOOP)
    os.kill(training_pid(attach), signal.SIGKILL)  # before its agent has written a thing
    code, _out, err = finish(attach)
    assert code == 137 and "Traceback" not in err, err
    run = report(db)["run"]
    assert run["status"] == "killed" and run["steps"] == 0


def test_both_killed_together(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    attach = start_attach(db, *SLOW_LOOP)
    wait_steps(db, 5, attach)
    child = training_pid(attach)
    killed_at = time.time()
    os.killpg(attach.pid, signal.SIGKILL)  # the whole session: supervisor and training at once
    attach.wait(timeout=30)
    wait_until(lambda: pid_gone(child), timeout=10, what="the training")
    print(f"\nboth killed: samples lost {samples_lost(db, killed_at)} s")
    assert_abandoned(db)


def test_training_below_a_wrapper_ends_with_the_supervisor(tmp_path: Path) -> None:
    """``attach -- sh -c "python train.py; ..."``: the shell dies with the supervisor; the
    Python below it has no such link to it, its agent's watch ends it and says why."""
    db = tmp_path / "run.db"
    shell = f"{sys.executable} {LOOP} --steps 400 --sleep 0.05; echo done"
    attach = start_attach(db, "--", "sh", "-c", shell)
    wait_steps(db, 5, attach)
    training = row(db, "SELECT pid FROM processes")
    sh = psutil.Process(attach.pid).children()[0].pid
    assert training != sh  # the training is a grandchild
    os.kill(attach.pid, signal.SIGKILL)
    attach.wait(timeout=30)
    wait_until(lambda: pid_gone(training) and pid_gone(sh), timeout=15, what="the training")
    (message,) = [m for (m,) in _events(db, "supervisor_gone")]
    assert f"pid {attach.pid}" in message
    assert_abandoned(db)


def _events(db: Path, kind: str) -> list[tuple[str]]:
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT message FROM events WHERE kind = ?", (kind,)).fetchall()
    finally:
        conn.close()

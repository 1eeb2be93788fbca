"""Another process holds a write lock on the run file for longer than the writer's retry window
(issue 21: a backup tool, a ``sqlite3`` shell). No step may be lost in silence: the structure
rows wait (in memory, then in the spill file beside the run file) and reach the file when the
lock goes, by the writer itself or, after the training ended, by attach's supervisor. While it
waits, the run is ``running``, never ``abandoned``.

The retry window is made short with MEMSCOPE_BUSY_TIMEOUT and the in-memory cap small with
MEMSCOPE_SPILL_AFTER, so a lock of a few seconds is "longer than the window" and spills.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults.runs import (LOOP, Lock, finish, integrity, listen, report, start_attach, steps_recorded,
                         training_gone, wait_steps, wait_until)
from memscope.store.reader import RunReader
from memscope.store.runs import create_run, register_writer
from memscope.store.spill import spill_files, total_size
from memscope.store.writer import RunWriter

pytestmark = pytest.mark.timeout(180)

STEPS = 400


def attach(db: Path, *args: str) -> subprocess.Popen[str]:
    from conftest import ROOT

    env = dict(os.environ, OMP_NUM_THREADS="1", MEMSCOPE_BUSY_TIMEOUT="0.3",
               MEMSCOPE_SPILL_AFTER="40")
    return subprocess.Popen([sys.executable, "-m", "memscope", "attach", "--headless", "--db",
                             str(db), LOOP, "--steps", str(STEPS), *args], cwd=ROOT, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def status_now(db: Path) -> str:
    with RunReader(db) as reader:
        run = reader.run()
        assert run is not None
        return str(run["status"])


def test_a_lock_released_during_the_training(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc = attach(db, "--sleep", "0.01")
    wait_steps(db, 20, proc)
    lock = Lock(db)
    try:
        # the writer gives up its short window, then spills past 40 rows: the file appears
        wait_until(lambda: total_size(str(db)) > 20_000, timeout=60, what="rows spilled")
        assert status_now(db) == "running"  # alive behind the lock, not abandoned
    finally:
        lock.release()
    code, _out, err = finish(proc)
    assert code == 0, err
    assert steps_recorded(db) == list(range(STEPS))  # every step, in order, none twice
    assert spill_files(str(db)) == []  # replayed, then removed
    data = report(db)
    assert data["run"]["status"] == "finished" and data["run"]["steps"] == STEPS
    # shed memory samples are counted and explained; no structure row is
    assert any("takes writes again" in line for line in data["run"]["recording"]), data["run"]["recording"]
    assert not any("lost" in line for line in data["run"]["recording"])
    assert integrity(db) == "ok"


def test_a_lock_held_past_the_end_of_the_training(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc = attach(db, "--sleep", "0.005")  # short steps: the training ends behind the lock
    wait_steps(db, 20, proc)
    lock = Lock(db)
    said, waits = listen(proc, "is locked by another process")  # attach's stderr, until it says it waits
    try:
        # the training ends behind the lock; attach then waits for it, however long
        wait_until(lambda: training_gone(proc.pid), timeout=90, what="the training to end")
        assert spill_files(str(db))  # its last rows wait there
        assert status_now(db) == "running"  # the supervisor still finishes it
        # attach's first try (1 s) finds the lock: it says so on stderr, and waits on
        assert waits.wait(timeout=90), "".join(said)[-3000:]
        assert status_now(db) == "running"
    finally:
        lock.release()
    code, _out, err = finish(proc)
    err = "".join(said) + err
    assert code == 0, err
    assert "is locked by another process" in err and "waiting" in err  # said on stderr
    assert steps_recorded(db) == list(range(STEPS))
    data = report(db)
    assert data["run"]["status"] == "finished" and data["run"]["steps"] == STEPS
    assert any("written then" in line for line in data["run"]["recording"])
    with RunReader(db) as reader:  # the process's own last word came through the spill file
        assert [p["status"] for p in reader.processes()] == ["stopped"]


def test_samples_keep_their_cadence_behind_a_5s_lock(tmp_path: Path) -> None:
    """The writer and the sampler share one thread (issue 21, address space): a lock shorter
    than the busy window (10 s by default) is waited out in short tries, one a turn, so the
    samples go on at their cadence (20 a second) and reach the file when the lock goes. The
    training holds meanwhile (no step boundary takes a sample of its own): every sample of the
    5 s is the thread's. A writer that waited in one long busy wait would leave a 5 s hole."""
    db = tmp_path / "r.db"
    go_on = tmp_path / "go-on"
    proc = start_attach(db, LOOP, "--steps", "40", "--hold-at", "20", "--hold-file", str(go_on))
    wait_steps(db, 20, proc)
    lock = Lock(db)
    held_from = time.time()
    time.sleep(5.0)
    held_until = time.time()
    lock.release()
    go_on.touch()
    code, _out, err = finish(proc)
    assert code == 0, err
    assert steps_recorded(db) == list(range(40))
    with RunReader(db) as reader:
        assert reader.events("recording_degraded") == []  # within the window: nothing shed
        stamps = [t for (t,) in reader.conn.execute("SELECT t FROM samples ORDER BY t")]
    during = [held_from] + [t for t in stamps if held_from < t < held_until] + [held_until]
    gaps = [b - a for a, b in zip(during, during[1:])]
    # 100 samples at 20 a second; a generous bound for a loaded machine, 5 s if they stalled
    assert len(during) - 2 >= 40 and max(gaps) < 1.0, (len(during) - 2, max(gaps))


def test_rows_that_cannot_be_spilled_are_counted_as_lost_steps(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    create_run(str(db), ["python", "train.py"])
    proc, made = register_writer(str(db), {"pid": 1, "started": time.time(), "status": "running"})
    assert made is not None
    os.remove(made.path)
    os.mkdir(made.path)  # the spill file cannot be written (and is never made again elsewhere)
    writer = RunWriter(str(db), flush_interval=0.02, busy_timeout=0.1, spill_after=5)
    writer.proc_id = proc
    writer.use_spill(made)
    writer.start()
    lock = Lock(db)
    for step in range(30):
        writer.insert("steps", {"proc": proc, "step": step, "start": float(step), "end": step + 0.5,
                                "status": "ok"})
    wait_until(lambda: writer.lost_steps > 0, timeout=30, what="a spill failure")
    lock.release()
    writer.close()
    with RunReader(db) as reader:
        kept = [s["step"] for s in reader.steps(proc)]
        lost = writer.lost_steps
        assert lost == 30 - len(kept) and lost > 0
        (final,) = reader.events("recording_incomplete")
        assert final["data"]["lost_steps"] == lost
        assert f"{lost} steps" in final["message"] and "spill file" in final["message"]
        degraded = reader.events("recording_degraded")
        assert degraded and "steps lost" in degraded[0]["message"]


def test_a_fresh_spill_file_is_a_sign_of_life(tmp_path: Path) -> None:
    # judged by heartbeat (another host's file): a stale heartbeat, but the writer is touching
    # its spill file while a lock holds it off
    db = tmp_path / "r.db"
    create_run(str(db), ["python", "train.py"], started=time.time() - 600)
    _, made = register_writer(str(db), {"pid": 1, "host": "elsewhere", "started": time.time() - 600,
                                        "heartbeat": time.time() - 600, "status": "running"})
    assert made is not None
    os.utime(made.path, (time.time() - 600, time.time() - 600))  # made with the run, 10 minutes ago
    conn = sqlite3.connect(db)
    conn.execute("UPDATE run SET host = 'elsewhere'")
    conn.commit()
    conn.close()
    assert socket.gethostname() != "elsewhere"
    assert status_now(db) == "abandoned"
    planted = Path(f"{db}-spill-{'0' * 32}")  # a file the run did not make: no sign of life
    planted.write_text('{"pid": 1}\n')
    assert status_now(db) == "abandoned"
    made.touch()
    assert status_now(db) == "running"

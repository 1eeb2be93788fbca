"""memscope's one thread (memscope/turns.py): jobs in turn, and the run file's writer among them
keeping its turns short behind a lock, so the job beside it (the memory samples) keeps going."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from memscope.store.reader import RunReader
from memscope.store.runs import create_run, register_process
import memscope.store.writer as writer_module
from memscope.store.writer import RunWriter
from memscope.turns import TurnThread


def test_jobs_take_turns_until_each_is_done() -> None:
    seen: list[str] = []
    done = threading.Event()

    def counted(name: str, turns: int):  # type: ignore[no-untyped-def]
        left = [turns]

        def job() -> float | None:
            seen.append(name)
            left[0] -= 1
            return 0.001 if left[0] else None

        return job

    def broken() -> float | None:
        seen.append("broken")
        raise RuntimeError("a bug in a job")

    def once() -> bool:  # a chore: False at once, dropped
        done.set()
        return False

    thread = TurnThread("memscope-test")
    thread.add(counted("a", 3))
    thread.add(counted("b", 2), first_in=0.0)
    thread.add(broken)
    thread.every(0.001, once)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()  # no job left: it ended by itself
    assert seen.count("a") == 3 and seen.count("b") == 2
    assert seen.count("broken") == 1  # dropped after it raised; the others went on
    assert done.is_set()


def test_a_hurried_job_runs_now_and_only_this_thread_is_on_thread() -> None:
    ran = threading.Event()
    on_thread: list[bool] = []
    thread = TurnThread("memscope-test")

    def slow() -> float | None:
        on_thread.append(thread.on_thread())
        ran.set()
        return None

    thread.add(slow, first_in=3600.0)
    thread.start()
    assert not ran.wait(0.2) and not thread.on_thread()
    thread.hurry(slow)
    assert ran.wait(30) and on_thread == [True]
    thread.join(30)
    assert not thread.is_alive()


def test_a_hurried_bound_method_runs_now() -> None:
    """The writer hurries its own turn, a bound method: read twice, it is two objects (equal,
    not identical). Matched by identity, the close waited for the writer's next turn (175 ms at
    every process exit)."""

    class Job:
        def __init__(self) -> None:
            self.ran = threading.Event()

        def turn(self) -> float | None:
            self.ran.set()
            return None

    job = Job()
    thread = TurnThread("memscope-test")
    thread.add(job.turn, first_in=3600.0)
    thread.start()
    thread.hurry(job.turn)
    assert job.ran.wait(5)
    thread.join(30)
    assert not thread.is_alive()


def test_the_writer_waits_out_a_lock_in_short_turns(tmp_path: Path) -> None:
    """A lock of 1.5 s, well inside the busy window (10 s): the job beside the writer keeps
    running meanwhile, the rows queued behind the lock reach the file after it, nothing is
    shed and nothing is called degraded."""
    db = tmp_path / "r.db"
    create_run(str(db), ["python", "train.py"])
    proc = register_process(str(db), {"pid": 1, "started": time.time(), "status": "running"})
    thread = TurnThread("memscope-test")
    writer = RunWriter(str(db), flush_interval=0.05, busy_timeout=10.0)
    writer.proc_id = proc
    writer.start(thread)
    beats: list[float] = []
    stop = threading.Event()

    def sampler() -> float | None:
        beats.append(time.monotonic())
        return None if stop.is_set() else 0.01

    thread.add(sampler)
    thread.start()
    writer.insert("steps", {"proc": proc, "step": 0, "start": 0.0, "end": 0.5, "status": "ok"})
    deadline = time.monotonic() + 30
    while writer.written < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    blocker = sqlite3.connect(db, isolation_level=None, timeout=10)
    blocker.execute("BEGIN IMMEDIATE")
    held_from = time.monotonic()
    for step in range(1, 30):
        writer.insert("steps", {"proc": proc, "step": step, "start": float(step), "end": step + 0.5,
                                "status": "ok"})
        writer.insert("samples", {"proc": proc, "t": float(step), "step": step, "rss": 1000})
    time.sleep(1.5)
    held_until = time.monotonic()
    blocker.execute("COMMIT")
    blocker.close()
    stop.set()
    writer.close()
    thread.join(30)
    during = [held_from] + [t for t in beats if held_from < t < held_until] + [held_until]
    # 150 turns at 100 a second; a writer in one long busy wait would leave a 1.5 s hole
    assert len(during) - 2 >= 30 and max(b - a for a, b in zip(during, during[1:])) < 0.5
    assert writer.dropped == 0 and writer.degraded_since is None
    with RunReader(db) as reader:
        assert [s["step"] for s in reader.steps(proc)] == list(range(30))
        assert reader.sample_count() == 29
        assert reader.events("recording_degraded") == []


def test_the_spill_file_is_replayed_in_slices_with_new_rows_after(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows spilled behind a lock go back a slice a turn (one 1,000-row chunk here), so the
    samples beside the writer wait at most one slice; rows queued meanwhile go after them, in
    order, none twice."""
    monkeypatch.setattr(writer_module, "REPLAY_TURN_S", 0.0)
    db = tmp_path / "r.db"
    create_run(str(db), ["python", "train.py"])
    proc = register_process(str(db), {"pid": 1, "started": time.time(), "status": "running"})
    writer = RunWriter(str(db), flush_interval=0.02, busy_timeout=0.1, spill_after=5)
    writer.proc_id = proc
    thread = TurnThread("memscope-test")
    writer.start(thread)
    seen: set[int] = set()  # where the replay stood at the turns of the job beside the writer
    stop = threading.Event()

    def beside() -> float | None:
        if writer._spill_rows:
            seen.add(writer._spill_offset)
        return None if stop.is_set() else 0.005

    thread.add(beside)
    thread.start()
    blocker = sqlite3.connect(db, isolation_level=None, timeout=10)
    blocker.execute("BEGIN IMMEDIATE")

    def step(n: int) -> None:
        writer.insert("steps", {"proc": proc, "step": n, "start": float(n), "end": n + 0.5, "status": "ok"})

    for n in range(5000):
        step(n)
    deadline = time.monotonic() + 60
    while writer.spilled < 5000:
        assert time.monotonic() < deadline, writer.spilled
        time.sleep(0.02)
    blocker.execute("COMMIT")
    blocker.close()
    n = 5000
    while writer._spill_rows:  # while the spill file goes back, chunk by chunk
        assert time.monotonic() < deadline, writer._spill_offset
        step(n)
        n += 1
        time.sleep(0.002)
    stop.set()
    writer.close()
    thread.join(30)
    assert len(seen - {0}) >= 3  # the other job ran between slices, several times
    with RunReader(db) as reader:
        assert [s["step"] for s in reader.steps(proc)] == list(range(n))
    assert writer.dropped == 0 and not Path(writer.spill_path).exists()

"""The writer under injected write errors: real SQLite connections made to refuse (read-only,
locked by another connection, a database that is full, a row the table will not take).

What must hold: the run's structure (steps, events) survives every one of them, only memory
samples are shed, every loss is counted, and the file says why and from when.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from memscope.store.reader import RunReader
from memscope.store.runs import create_run, register_process
from memscope.store.writer import RunWriter

pytestmark = pytest.mark.timeout(120)


def new_run(path: Path) -> int:
    create_run(str(path), ["python", "train.py"])
    return register_process(str(path), {"pid": 1, "started": time.time(), "status": "running"})


class Switch:
    """A fault that is on until the test turns it off: applied to every connection the
    writer opens (it reconnects after each refusal)."""

    def __init__(self, on: str, off: str) -> None:
        self.refusing = True
        self.on, self.off = on, off
        self.connections = 0

    def __call__(self, conn: sqlite3.Connection) -> None:
        self.connections += 1
        sql = self.on if self.refusing else self.off
        if "{pages}" in sql:
            sql = sql.format(pages=conn.execute("PRAGMA page_count").fetchone()[0])
        conn.execute(sql)


def feed(writer: RunWriter, proc: int, steps: range, samples_per_step: int = 5) -> None:
    for step in steps:
        for i in range(samples_per_step):
            writer.insert("samples", {"proc": proc, "t": step + i / 10, "step": step, "rss": 1000 + i})
        writer.insert("steps", {"proc": proc, "step": step, "start": float(step),
                                "end": step + 0.9, "peak_rss": 1000, "status": "ok"})
        if step % 5 == 0:
            writer.insert("events", {"proc": proc, "t": float(step), "step": step,
                                     "kind": "warning", "message": f"event at {step}", "data": None})


def events(db: Path, kind: str) -> list[dict[str, Any]]:
    with RunReader(db) as reader:
        return reader.events(kind)


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def check_survivors(db: Path, writer: RunWriter, proc: int, steps: int, error_word: str) -> None:
    with RunReader(db) as reader:
        got = [s["step"] for s in reader.steps(proc)]
        warnings = [e["message"] for e in reader.events("warning")]
        samples = reader.sample_count()
        row = reader.processes()[0]
    assert got == list(range(steps)), "a step row was lost"
    assert warnings == [f"event at {s}" for s in range(0, steps, 5)], "an event was lost"
    assert writer.dropped_structure == 0
    assert samples + writer.dropped == steps * 5, "a sample neither written nor counted"
    assert row["dropped"] == writer.dropped  # the heartbeat keeps the count current
    degraded = events(db, "recording_degraded")
    assert degraded, "nothing in the file says recording degraded"
    data = degraded[0]["data"]
    assert error_word in data["error"] and data["since"] <= time.time()
    recovered = events(db, "recording_recovered")
    assert recovered and error_word in recovered[0]["message"]


def run_with_fault(tmp_path: Path, switch: Switch, error_word: str, **kw: Any) -> None:
    db = tmp_path / "r.db"
    proc = new_run(db)
    writer = RunWriter(str(db), flush_interval=0.05, on_connect=switch, **kw)
    writer.proc_id = proc
    writer.start()
    step = 0
    deadline = time.monotonic() + 30
    while writer.degraded_since is None:  # until the file refuses (a full one: when a page is needed)
        assert time.monotonic() < deadline, "the fault never showed"
        feed(writer, proc, range(step, step + 10))
        step += 10
        time.sleep(0.02)
    feed(writer, proc, range(step, step + 20))  # while the file refuses
    time.sleep(0.3)
    switch.refusing = False  # the fault clears: the next attempt opens a good connection
    feed(writer, proc, range(step + 20, step + 30))
    wait_for(lambda: writer.degraded_since is None)
    writer.close()
    assert switch.connections >= 2  # it reconnected after the refusal
    check_survivors(db, writer, proc, step + 30, error_word)


def test_a_read_only_connection(tmp_path: Path) -> None:
    run_with_fault(tmp_path, Switch("PRAGMA query_only = ON", "PRAGMA query_only = OFF"), "readonly")


def test_a_full_database(tmp_path: Path) -> None:
    # max_page_count at the file's size: SQLite's own SQLITE_FULL, as on a full disk
    run_with_fault(tmp_path, Switch("PRAGMA max_page_count = {pages}",
                                    "PRAGMA max_page_count = 1000000"), "full")


def test_a_file_locked_for_longer_than_the_busy_timeout(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc = new_run(db)
    writer = RunWriter(str(db), flush_interval=0.05, busy_timeout=0.2)
    writer.proc_id = proc
    writer.start()
    feed(writer, proc, range(0, 10))
    wait_for(lambda: writer.written >= 10)
    blocker = sqlite3.connect(db, isolation_level=None, timeout=10)
    blocker.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    feed(writer, proc, range(10, 30))
    wait_for(lambda: writer.degraded_since is not None)
    time.sleep(0.5)
    blocker.execute("COMMIT")
    blocker.close()
    feed(writer, proc, range(30, 50))
    wait_for(lambda: writer.degraded_since is None)
    writer.close()
    check_survivors(db, writer, proc, 50, "locked")


def test_a_bad_row_is_refused_alone(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc = new_run(db)
    writer = RunWriter(str(db), flush_interval=0.5)
    writer.proc_id = proc
    writer.start()
    feed(writer, proc, range(0, 10))
    # the same step twice in one batch: the primary key refuses the second, only it
    writer.insert("steps", {"proc": proc, "step": 3, "start": 0.0, "end": 1.0, "status": "ok"})
    writer.insert("steps", {"proc": proc, "step": 10, "start": 10.0, "end": 10.9, "status": "ok"})
    writer.close()
    with RunReader(db) as reader:
        assert [s["step"] for s in reader.steps(proc)] == list(range(11))
        assert reader.sample_count() == 50
        assert [e["message"] for e in reader.events("warning")] == ["event at 0", "event at 5"]
    assert writer.dropped == 1 and writer.dropped_structure == 1
    (event,) = events(db, "recording_degraded")
    assert "steps row was refused" in event["message"] and "UNIQUE" in event["data"]["error"]


def test_back_pressure_sheds_samples_only(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc = new_run(db)
    writer = RunWriter(str(db), max_queue=100)  # not started: nothing drains the queue
    writer.proc_id = proc
    feed(writer, proc, range(200))  # 1000 samples, 200 steps, 40 events
    assert writer.dropped == 900 and writer.dropped_structure == 0
    writer.start()
    writer.close()
    with RunReader(db) as reader:
        assert len(reader.steps(proc)) == 200 and reader.sample_count() == 100
        assert len(reader.events("warning")) == 40
        assert reader.processes()[0]["dropped"] == 900
    (event,) = events(db, "recording_degraded")
    assert "queue full" in event["message"] and event["data"]["dropped"] >= 900


def test_heartbeat_and_drop_count_are_current_while_running(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc = new_run(db)
    writer = RunWriter(str(db), max_queue=100, flush_interval=0.05)
    writer.proc_id = proc
    writer.samples = lambda: 123
    for _ in range(300):  # 200 dropped before the thread drains anything
        writer.insert("samples", {"proc": proc, "t": 0.0, "step": 0, "rss": 1})
    writer.start()

    def row() -> dict[str, Any]:
        with RunReader(db) as reader:
            return reader.processes()[0]

    wait_for(lambda: row()["dropped"] == 200)  # during the run, not only at its end
    first = row()["heartbeat"]
    wait_for(lambda: row()["heartbeat"] > first)  # stamped again about a second later
    assert row()["samples"] == 123 and row()["status"] == "running"
    writer.close()


def test_writer_thread_survives_and_structure_waits_for_the_disk(tmp_path: Path) -> None:
    # a refusal that lasts several retries: the pending structure is kept and written later,
    # while samples of those batches are shed (counted)
    switch = Switch("PRAGMA query_only = ON", "PRAGMA query_only = OFF")
    db = tmp_path / "r.db"
    proc = new_run(db)
    writer = RunWriter(str(db), flush_interval=0.05, on_connect=switch)
    writer.proc_id = proc
    writer.start()
    stop = threading.Event()

    def trainer() -> None:
        step = 0
        while not stop.is_set():
            feed(writer, proc, range(step, step + 1))
            step += 1
            time.sleep(0.01)
        trainer.steps = step  # type: ignore[attr-defined]

    t = threading.Thread(target=trainer)
    t.start()
    time.sleep(2.5)  # several retries, with growing waits
    switch.refusing = False
    time.sleep(0.5)
    stop.set()
    t.join()
    writer.close()
    steps = trainer.steps  # type: ignore[attr-defined]
    with RunReader(db) as reader:
        assert [s["step"] for s in reader.steps(proc)] == list(range(steps))
        assert reader.sample_count() + writer.dropped == steps * 5
    assert writer.dropped > 0 and writer.dropped_structure == 0
    data = events(db, "recording_degraded")[0]["data"]
    assert json.dumps(data) and "readonly" in data["error"]

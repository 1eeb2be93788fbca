"""The run-file store: schema versioning, the non-blocking writer, the read-only reader."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from memscope.store.reader import RunReader
from memscope.store.runs import create_run, finish_run, register_process
from memscope.store.schema import APPLICATION_ID, SCHEMA_VERSION, RunFileError, migrate
from memscope.store.writer import RunWriter


def new_run(path: Path) -> int:
    create_run(str(path), ["python", "train.py"])
    return register_process(str(path), {"pid": 1, "started": time.time(), "status": "running"})


def test_schema_is_versioned_and_recorded(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    new_run(db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        versions = [r[0] for r in conn.execute("SELECT version FROM migrations")]
        # migrating again is a no-op
        conn.isolation_level = None
        migrate(conn)
        assert [r[0] for r in conn.execute("SELECT version FROM migrations")] == versions
    assert versions == list(range(1, SCHEMA_VERSION + 1))


def test_migrate_refuses_foreign_and_newer_files(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other, isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    with pytest.raises(RunFileError, match="not a memscope run"):
        migrate(conn, str(other))
    conn.close()
    db = tmp_path / "r.db"
    new_run(db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    with pytest.raises(RunFileError, match="newer memscope"):
        migrate(conn, str(db))
    conn.close()


def test_writer_batches_in_order_and_flushes_on_close(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc = new_run(db)
    writer = RunWriter(str(db), flush_interval=0.05)
    writer.start()
    for i in range(500):
        assert writer.insert("samples", {"proc": proc, "t": float(i), "step": i // 100, "rss": i})
    writer.execute("UPDATE samples SET rss = -1 WHERE t = 0")  # applied after the inserts
    writer.close()
    with RunReader(db) as reader:
        assert reader.sample_count() == 500
        assert reader.scalar("SELECT rss FROM samples WHERE t = 0") == -1
    assert writer.dropped == 0 and writer.written == 500


def test_writer_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc = new_run(db)
    writer = RunWriter(str(db), max_queue=100)  # not started: nothing drains the queue
    t0 = time.perf_counter()
    accepted = sum(writer.insert("samples", {"proc": proc, "t": 0.0, "step": 0, "rss": 1})
                   for _ in range(1000))
    elapsed = time.perf_counter() - t0
    assert accepted == 100 and writer.dropped == 900
    assert elapsed < 1.0  # a full queue answers at once; it never waits for the disk
    writer.start()
    writer.close()
    with RunReader(db) as reader:
        assert reader.sample_count() == 100


def test_writer_waits_out_a_locked_file(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc = new_run(db)
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holding the write lock for a while
    writer = RunWriter(str(db), flush_interval=0.05)
    writer.start()
    writer.insert("samples", {"proc": proc, "t": 1.0, "step": 0, "rss": 1})
    time.sleep(0.5)
    blocker.execute("COMMIT")
    blocker.close()
    writer.close()
    with RunReader(db) as reader:
        assert reader.sample_count() == 1


def test_reader_is_read_only_and_sees_live_writes(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc = new_run(db)
    writer = RunWriter(str(db), flush_interval=0.05)
    writer.start()
    reader = RunReader(db)
    assert reader.run()["status"] == "running"
    writer.insert("samples", {"proc": proc, "t": 1.0, "step": 0, "rss": 1})
    deadline = time.monotonic() + 5
    while reader.sample_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reader.sample_count() == 1
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.conn.execute("DELETE FROM samples")
    reader.close()
    writer.close()
    finish_run(str(db), exit_code=0, signal=None)
    with RunReader(db) as reader:
        run = reader.run()
        assert run["status"] == "finished" and run["exit_code"] == 0
        assert reader.processes()[0]["status"] == "lost"  # it never said goodbye


def test_reader_opens_paths_with_odd_characters(tmp_path: Path) -> None:
    db = tmp_path / "a run #1?.db"
    new_run(db)
    with RunReader(db) as reader:
        assert reader.run()["command"] == ["python", "train.py"]

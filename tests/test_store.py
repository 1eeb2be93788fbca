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
    writer.update("samples", {"t": 0.0}, {"rss": 123456789})  # applied after the inserts
    writer.close()
    with RunReader(db) as reader:
        assert reader.sample_count() == 500
        assert reader.scalar("SELECT rss FROM samples WHERE t = 0") == 123456789
    assert writer.dropped == 0 and writer.written == 500


def test_writer_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc = new_run(db)
    # not started: nothing drains the queue, so an insert that waited for room would wait
    # forever (pytest-timeout ends it); no wall-clock limit needed to see that it never waits
    writer = RunWriter(str(db), max_queue=100)
    accepted = sum(writer.insert("samples", {"proc": proc, "t": 0.0, "step": 0, "rss": 1})
                   for _ in range(1000))
    assert accepted == 100 and writer.dropped == 900
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


def test_reader_offers_the_file_to_sqlite_utils() -> None:
    """``reader.db``: the run file as a sqlite-utils Database for ad-hoc queries (the one use of
    sqlite-utils; tests/test_lowest_bounds.py runs this with the lowest version it allows)."""
    fixture = Path(__file__).parent / "tui" / "data" / "leaky.sqlite"
    with RunReader(fixture) as reader:
        assert {"run", "steps", "samples", "events"} <= set(reader.db.table_names())
        rows = list(reader.db["steps"].rows_where("status = ?", ["ok"], order_by="step"))
        assert [r["step"] for r in rows] == [s["step"] for s in reader.steps() if s["status"] == "ok"]
        assert reader.db["samples"].count == reader.sample_count()
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.db["steps"].delete_where()


def test_reader_opens_paths_with_odd_characters(tmp_path: Path) -> None:
    db = tmp_path / "a run #1?.db"
    new_run(db)
    with RunReader(db) as reader:
        assert reader.run()["command"] == ["python", "train.py"]


def _v3_file(db: Path) -> sqlite3.Connection:
    """A schema-3 run file (before backward_s / alloc_* / leak module), with one profiled step."""
    from memscope.store import schema

    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    for target in range(3):
        for st in schema._split_statements(schema.MIGRATIONS[target]):
            conn.execute(st)
    conn.execute("PRAGMA user_version = 3")
    conn.execute("INSERT INTO run (id, command, started, ended, status) VALUES (1, '[]', 0, 2, 'finished')")
    conn.execute("INSERT INTO processes (id, pid, started, status) VALUES (1, 1, 0, 'stopped')")
    conn.execute("INSERT INTO steps (proc, step, start, end, peak_rss) VALUES (1, 0, 0, 1, 1000)")
    conn.execute("INSERT INTO layer_stats VALUES (1, 0, 'fc', 'Linear', 1, 4096, 1, 512, 0.002)")
    conn.execute("INSERT INTO leak_holders VALUES (1, 0, 'other', 'float32', '[2]', 'cpu', 0, NULL,"
                 " '__main__.x', NULL)")
    return conn


def test_schema_3_file_reads_then_migrates_to_4(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    db = tmp_path / "v3.db"
    conn = _v3_file(db)
    # read as it is: the layers view works without the v4 columns (backward_s unknown)
    out = subprocess.run([sys.executable, "-m", "memscope", "layers", str(db), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (mod,) = json.loads(out.stdout)["modules"]
    assert mod["module"] == "fc" and mod["activation_bytes"] == 4096
    assert mod["backward_s"] is None and mod["alloc_peak"] is None
    migrate(conn, str(db))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 4
    cols = {r[1] for r in conn.execute("PRAGMA table_info(layer_stats)")}
    assert {"backward_s", "alloc_delta", "alloc_peak"} <= cols
    assert "module" in {r[1] for r in conn.execute("PRAGMA table_info(leak_holders)")}
    # old rows survive with NULL in the new columns
    assert conn.execute("SELECT saved_bytes, backward_s FROM layer_stats").fetchone() == (4096, None)
    assert conn.execute("SELECT held_by, module FROM leak_holders").fetchone() == ("__main__.x", None)
    assert [r[0] for r in conn.execute("SELECT version FROM migrations")] == list(range(4, SCHEMA_VERSION + 1))
    conn.close()


def test_a_statement_kept_alive_elsewhere_does_not_block_the_commit(tmp_path: Path) -> None:
    """Another thread's gc.get_objects() list can keep a cursor we dropped alive: its statement
    would stay in progress and SQLite would refuse COMMIT (a run file lost its migration and every
    row that way). Writing connections finish each statement at once."""
    from memscope.store.writer import connect_rw

    plain = sqlite3.connect(tmp_path / "plain.db", isolation_level=None)
    plain.executescript("CREATE TABLE t (x); INSERT INTO t VALUES (1), (2), (3);")
    plain.execute("BEGIN IMMEDIATE")
    kept = plain.execute("INSERT INTO t SELECT x + 10 FROM t RETURNING x")  # stepped once: in progress
    with pytest.raises(sqlite3.OperationalError, match="SQL statements in progress"):
        plain.execute("COMMIT")  # what a plain connection does (the failure being guarded)
    del kept
    plain.close()

    conn = connect_rw(str(tmp_path / "run.db"))
    conn.execute("BEGIN IMMEDIATE")
    kept = conn.execute("INSERT INTO migrations (version, applied) VALUES (98, 0), (99, 0) "
                        "RETURNING version")  # held, as a gc list would hold it
    conn.execute("COMMIT")
    assert [r[0] for r in kept.fetchall()] == [98, 99] and kept.fetchone() is None
    assert conn.execute("SELECT count(*) FROM migrations WHERE version >= 98").fetchone()[0] == 2
    conn.close()


def test_schema_6_layer_rows_read_as_step_sums_then_migrate_to_7(tmp_path: Path) -> None:
    """Before schema 7 a layer row is summed over the step's micro-batches: read as it is, the
    readers say nothing about micro-batches (null), and the migration adds the column as NULL."""
    import json
    import subprocess
    import sys

    from memscope.store import schema

    db = tmp_path / "v6.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    for target in range(6):
        for st in schema._split_statements(schema.MIGRATIONS[target]):
            conn.execute(st)
    conn.execute("PRAGMA user_version = 6")
    conn.execute("INSERT INTO run (id, command, started, ended, status) VALUES (1, '[]', 0, 2, 'finished')")
    conn.execute("INSERT INTO processes (id, pid, started, status) VALUES (1, 1, 0, 'stopped')")
    conn.execute("INSERT INTO steps (proc, step, start, end, peak_rss) VALUES (1, 0, 0, 1, 1000)")
    conn.execute("INSERT INTO layer_stats (proc, step, module, type, calls, saved_bytes, saved_tensors,"
                 " output_bytes, forward_s) VALUES (1, 0, 'fc', 'Linear', 4, 16384, 4, 2048, 0.002)")

    def cli(*args: str) -> dict[str, object]:
        out = subprocess.run([sys.executable, "-m", "memscope", *args, str(db), "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))

    layers = cli("layers")
    assert layers["micro_batches"] is None and layers["modules"][0]["activation_bytes"] == 16384  # type: ignore[index]
    report = cli("report")
    assert report["hotspots_micro_batches"] is None and report["hotspots_step"] == 0
    migrate(conn, str(db))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 7
    assert conn.execute("SELECT saved_bytes, micro_batches FROM layer_stats").fetchone() == (16384, None)
    assert [r[0] for r in conn.execute("SELECT version FROM migrations")] == list(range(7, SCHEMA_VERSION + 1))
    conn.close()


def test_writer_tries_a_failed_open_again_and_keeps_the_rows(tmp_path: Path) -> None:
    """A run file that refuses the writer's first opens (another process's lock, a moment of a
    full disk) loses nothing once it opens; one that never opens counts every row as dropped."""
    db = tmp_path / "r.db"
    proc = new_run(db)
    refusals = [sqlite3.OperationalError("database is locked")] * 2

    def flaky(conn: sqlite3.Connection) -> None:
        if refusals:
            raise refusals.pop()

    writer = RunWriter(str(db), flush_interval=0.05, on_connect=flaky)
    writer.start()
    for i in range(50):
        assert writer.insert("steps", {"proc": proc, "step": i, "start": float(i), "end": i + 0.5})
    writer.close()
    assert not refusals and writer.error is None and writer.dropped == 0
    with RunReader(db) as reader:
        assert reader.scalar("SELECT count(*) FROM steps") == 50

    def never(conn: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    writer = RunWriter(str(db), flush_interval=0.05, on_connect=never)
    for i in range(5):
        writer.insert("steps", {"proc": proc, "step": 100 + i, "start": 0.0, "end": 1.0})
    writer.start()
    writer.close(timeout=30)
    assert writer.error is not None and "disk I/O error" in writer.error and writer.dropped == 5

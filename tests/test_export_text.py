"""``export`` writes the long series a block at a time: the text must be what the per-event and
per-row path writes (json.dumps of each event; csv.writer of each row), computed here again,
independently, from the run file's rows. A real run, with hostile rows added to a copy of it."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import memscope
from memscope.store.column_checks import BOUNDS, columns_clean
from memscope.store.reader import _BOUNDS, RunReader

FORMULA = ("=", "+", "-", "@", "\t", "\r")


@pytest.fixture(scope="module")
def real_run(oom_example_run: Path) -> Path:
    return oom_example_run


@pytest.fixture(scope="module")
def hostile_run(real_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real run plus a second (ranked) process and rows a writer would not make but a file
    from elsewhere can hold: phases a spreadsheet or CSV parser would trip on, a status with
    quotes and non-ASCII, a step that ends before it starts, samples at the same instant."""
    db = tmp_path_factory.mktemp("hostile") / "run.db"
    shutil.copy(real_run, db)
    with sqlite3.connect(db) as conn:
        started, = conn.execute("SELECT started FROM run").fetchone()
        conn.execute("INSERT INTO processes (id, pid, rank, started, status) VALUES (2, 4243, 1, ?, 'stopped')",
                     (started,))
        phases = ["=HYPERLINK(1)", "a,b", 'q"uote', "new\nline", "\r", "ünï ☃", "-1", "", None, "forward"]
        for i, phase in enumerate(phases):
            t = started + 0.5 + i // 2 * 0.1234567  # pairs at the same t: order by rowid
            conn.execute("INSERT INTO samples (proc, t, step, phase, rss) VALUES (?, ?, ?, ?, ?)",
                         (2, t, i, phase, 1000 + i))
        conn.execute("INSERT INTO samples (proc, t, step, phase, rss) VALUES (2, ?, 0, 'other', 7)",
                     (started + 0.0000001,))  # a time below a microsecond after the start
        for step, (start, end, status, rss, alloc) in enumerate([
                (started + 1, started + 2.0625, "ok", 5, None),       # a tie at 3 places
                (started + 3, started + 2.5, 'fä"il\\ed', None, 7),   # ends before it starts
                (started + 4, started + 4, "failed", None, None)]):
            conn.execute("INSERT INTO steps (proc, step, start, end, status, peak_rss, peak_allocated)"
                         " VALUES (2, ?, ?, ?, ?, ?, ?)", (step, start, end, status, rss, alloc))
    return db


def table_rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def expected_trace_lines(db: Path) -> list[str]:
    """The host-RSS and step events, each as json.dumps writes its dict."""
    started, = table_rows(db, "SELECT started FROM run")[0]
    dumps = [json.dumps(e, separators=(",", ":")) for e in _events(db, started)]
    return dumps


def _events(db: Path, origin: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for (pid,) in table_rows(db, "SELECT id FROM processes ORDER BY coalesce(rank, 0), id"):
        for t, rss in table_rows(db, "SELECT t, rss FROM samples WHERE proc = ? ORDER BY t, rowid", (pid,)):
            out.append({"ph": "C", "name": "host RSS", "pid": pid, "tid": 0,
                        "ts": round((t - origin) * 1e6, 3), "args": {"rss": rss}})
        for step, start, end, status, *peaks in table_rows(
                db, "SELECT step, start, end, status, peak_rss, peak_allocated, peak_reserved"
                    " FROM steps WHERE proc = ? ORDER BY step", (pid,)):
            args = {"step": step, "status": status}
            args.update({k: v for k, v in zip(("peak_rss", "peak_allocated", "peak_reserved"), peaks)
                         if v is not None})
            out.append({"ph": "X", "cat": "step", "name": f"step {step}", "pid": pid, "tid": 1,
                        "ts": round((start - origin) * 1e6, 3),
                        "dur": round(max(end - start, 0.0) * 1e6, 3), "args": args})
    return out


def cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, str) and v.startswith(FORMULA):
        return "'" + v
    return v.hex() if isinstance(v, bytes) else v


def expected_timeline(db: Path) -> str:
    started, = table_rows(db, "SELECT started FROM run")[0]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["rank", "proc", "time_s", "unix_time", "step", "phase", "metric", "device", "bytes"])
    for pid, rank in table_rows(db, "SELECT id, rank FROM processes ORDER BY coalesce(rank, 0), id"):
        for t, step, phase, rss in table_rows(
                db, "SELECT t, step, phase, rss FROM samples WHERE proc = ? ORDER BY t, rowid", (pid,)):
            w.writerow(["" if rank is None else rank, pid, f"{t - started:.6f}", f"{t:.6f}",
                        "" if step is None else step, cell(phase), "rss", "host", rss])
    return buf.getvalue()


def expected_table(db: Path, table: str) -> str:
    conn = sqlite3.connect(db)
    try:
        cur = conn.execute(f'SELECT * FROM "{table}"')
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([d[0] for d in cur.description])
        w.writerows([[cell(v) for v in row] for row in cur])
        return buf.getvalue()
    finally:
        conn.close()


@pytest.mark.parametrize("which", ["real_run", "hostile_run"])
def test_chrome_trace_text_is_json_dumps_of_each_event(which: str, request: pytest.FixtureRequest,
                                                       tmp_path: Path) -> None:
    db: Path = request.getfixturevalue(which)
    trace = tmp_path / "trace.json"
    out = memscope("export", str(db), "--chrome", str(trace))
    assert out.returncode == 0, out.stderr
    text = trace.read_bytes().decode()
    doc = json.loads(text)  # the whole file is valid JSON
    lines = [ln.rstrip(",") for ln in text.splitlines()[1:-1]]  # one event a line
    assert len(lines) == len(doc["traceEvents"])
    written = [ln for ln in lines if '"name":"host RSS"' in ln or '"cat":"step","name":"step ' in ln]
    expected = expected_trace_lines(db)
    assert len(expected) > 20
    assert written == expected


@pytest.mark.parametrize("which", ["real_run", "hostile_run"])
def test_csv_text_is_csv_writer_of_each_row(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    db: Path = request.getfixturevalue(which)
    target = tmp_path / "csv"
    out = memscope("export", str(db), "--csv", str(target))
    assert out.returncode == 0, out.stderr
    assert (target / "timeline.csv").read_bytes().decode() == expected_timeline(db)
    tables = [r[0] for r in table_rows(db, "SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in set(tables) - {"migrations"}:
        assert (target / f"{table}.csv").read_bytes().decode() == expected_table(db, table), table


def test_hostile_rows_are_really_there(hostile_run: Path, tmp_path: Path) -> None:
    """The hostile file exercises the quoting: its timeline has quoted and guarded cells."""
    text = expected_timeline(hostile_run)
    assert '"a,b"' in text and '"q""uote"' in text and "'=HYPERLINK(1)" in text and '"new\nline"' in text


def test_column_checks_match_the_readers_bounds() -> None:
    assert all(_BOUNDS[c] == b for c, b in BOUNDS.items())


@pytest.mark.parametrize("sql, clean", [
    ("", True),
    ("UPDATE samples SET rss = 1.5 WHERE rowid = (SELECT max(rowid) FROM samples)", False),
    ("UPDATE samples SET rss = 'x' WHERE rowid = (SELECT min(rowid) FROM samples)", False),
    ("UPDATE samples SET t = 'soon' WHERE rowid = (SELECT min(rowid) FROM samples)", False),
    ("UPDATE samples SET t = 1e13 WHERE rowid = (SELECT min(rowid) FROM samples)", False),
    ("UPDATE samples SET t = x'00ff' WHERE rowid = (SELECT max(rowid) FROM samples)", False),
    ("UPDATE samples SET rss = 9223372036854775807", False),  # sum() overflows: not clean
])
def test_column_checks(real_run: Path, tmp_path: Path, sql: str, clean: bool) -> None:
    db = tmp_path / "run.db"
    shutil.copy(real_run, db)
    if sql:
        with sqlite3.connect(db) as conn:
            conn.execute(sql)
    with RunReader(db) as reader:
        assert columns_clean(reader, "samples", 1, times=("t",), ints=("rss",)) is clean


@pytest.mark.parametrize("sql, message", [
    ("UPDATE samples SET rss = 1.5 WHERE rowid = (SELECT max(rowid) FROM samples)", "column rss holds 1.5"),
    ("UPDATE steps SET status = x'00ff' WHERE rowid = (SELECT max(rowid) FROM steps)",
     "column status holds a blob of 2 bytes"),
    ("UPDATE steps SET peak_rss = 2.5 WHERE rowid = (SELECT min(rowid) FROM steps)", "column peak_rss holds 2.5"),
])
def test_damaged_series_still_named(real_run: Path, tmp_path: Path, sql: str, message: str) -> None:
    db = tmp_path / "run.db"
    shutil.copy(real_run, db)
    with sqlite3.connect(db) as conn:
        conn.execute(sql)
    out = memscope("export", str(db), "--chrome", str(tmp_path / "t.json"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert message in out.stderr
    assert not (tmp_path / "t.json").exists()


def test_text_that_is_not_utf8_is_one_error_line(real_run: Path, tmp_path: Path) -> None:
    """Flipped bytes in a text value: sqlite3 refuses the row ("Could not decode to UTF-8"), as
    the row reads always did; one line, no traceback, no half-written file left behind."""
    db = tmp_path / "run.db"
    shutil.copy(real_run, db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE samples SET phase = CAST(x'ff41' AS TEXT) WHERE rowid = (SELECT max(rowid) FROM samples)")
    out = memscope("export", str(db), "--csv", str(tmp_path / "timeline.csv"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "damaged run file" in out.stderr and "phase" in out.stderr
    assert list(tmp_path.iterdir()) == [db]

"""``export`` makes the long series' text in SQLite (memscope/report/sql_text.py). The contract,
checked here against the run file's own rows, read independently: the trace is valid JSON with
the same events and values (times to the nanosecond, byte counts exact); every CSV file parses
back (csv.reader) to the stored values: integers exact, every REAL to the same double, text to
the same string (a formula guarded by a leading ``'``), times in timeline.csv to the microsecond.
On a real run, and on a copy with hostile rows: strings with quotes, backslashes, control
characters, NUL, text that is not UTF-8, samples at the same instant, extreme doubles."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import sqlite3
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from conftest import memscope
from memscope.report import chrome, csv_export, sql_text
from memscope.store.reader import RunReader
from memscope.store.schema import RunFileError

FORMULA = ("=", "+", "-", "@", "\t", "\r")
# SQLite's printf rounds a tie away from zero and, before 3.43, may round a value within about
# 2e-5 of a half unit the other way (measured: 1.7e-5 at most on a 1M-step run's 2M times)
SLACK = Fraction(5, 10**5)
HOSTILE = ['q"uote', "back\\slash", "c0:" + "".join(chr(i) for i in range(32)), "nul\x00byte",
           "a,b", "new\nline", "\u2028sep\u2029", "ünï ☃", "=HYPERLINK(1)", "-1", "@x", ""]
VALID_DOUBLES = [0.1, 1 / 3, 1e-300, 999999999.9999999, 5e-324, 2.0 ** 0.5, 2.2250738585072014e-308, -0.0,
                 123456789.125, 1e-7, 9007199.254740993, 3.0]
# what no memscope writes: doubles beyond any duration, sizes beyond 2**62, text and a blob where
# numbers belong (the export command refuses them in one line; its writers format any value)
EXTREME_DOUBLES = [1e300, 1.7976931348623157e308, 1e23, 9007199254740993.0]


@pytest.fixture(scope="module")
def real_run(oom_example_run: Path) -> Path:
    return oom_example_run


@pytest.fixture(scope="module")
def hostile_run(real_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real run plus a second (ranked) process and rows a writer would not make but a file
    from elsewhere can hold (see the module's docstring)."""
    db = tmp_path_factory.mktemp("hostile") / "run.db"
    shutil.copy(real_run, db)
    with sqlite3.connect(db) as conn:
        started, = conn.execute("SELECT started FROM run").fetchone()
        conn.execute("INSERT INTO processes (id, pid, rank, started, status) VALUES (2, 4243, 1, ?, 'stopped')",
                     (started,))
        phases: list[Any] = [*HOSTILE, "\r", None, "forward"]
        for i, phase in enumerate(phases):
            t = started + 0.5 + i // 3 * 0.1234567  # threes at the same t: ordered by rowid
            conn.execute("INSERT INTO samples (proc, t, step, phase, rss) VALUES (?, ?, ?, ?, ?)",
                         (2, t, i, phase, 1000 + i))
        conn.execute("INSERT INTO samples (proc, t, step, phase, rss) VALUES (2, ?, 0, CAST(x'ff41' AS TEXT), 7)",
                     (started + 0.0000001,))  # below a microsecond after the start; not UTF-8
        rows = [(started + 1, started + 2.0625, "ok", 5, None),  # a tie at 3 places
                (started + 3, started + 2.5, 'fä"il\\ed', None, 7),  # ends before it starts
                (started + 4, started + 4, "failed", None, None)]
        rows += [(started + 5 + i, started + 5.5 + i, s, i, None) for i, s in enumerate(HOSTILE)]
        for step, (start, end, status, rss, alloc) in enumerate(rows):
            conn.execute("INSERT INTO steps (proc, step, start, end, status, peak_rss, peak_allocated)"
                         " VALUES (2, ?, ?, ?, ?, ?, ?)", (step, start, end, status, rss, alloc))
        conn.execute("INSERT INTO steps (proc, step, start, end, status) VALUES (2, 99, ?, ?, CAST(x'ff42' AS TEXT))",
                     (started + 30, started + 31))
        # doubles at the edges of a duration's range and of their formats, sizes just under 2**62
        for i, (module, seconds) in enumerate(zip(HOSTILE, VALID_DOUBLES)):
            conn.execute("INSERT INTO layer_stats (proc, step, module, type, calls, saved_bytes, saved_tensors,"
                         " output_bytes, forward_s, backward_s) VALUES (2, ?, ?, ?, 1, ?, 1, 2, ?, NULL)",
                         (i, module, module, 2 ** 62 - i, seconds))
        for i, module in enumerate(HOSTILE):
            conn.execute("INSERT INTO events (proc, t, step, kind, message, data) VALUES (2, ?, ?, 'oom', ?, ?)",
                         (started + 40 + i, i, module, json.dumps({"phase": "forward", "module": module})))
        conn.execute("INSERT INTO events (proc, t, step, kind, message)"
                     " VALUES (2, ?, 0, 'note', CAST(x'ff44' AS TEXT))", (started + 60,))
    return db


@pytest.fixture(scope="module")
def damaged_run(hostile_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hostile run plus values memscope never writes (EXTREME_DOUBLES; text and a blob in
    number columns)."""
    db = tmp_path_factory.mktemp("damaged") / "run.db"
    shutil.copy(hostile_run, db)
    with sqlite3.connect(db) as conn:
        for i, seconds in enumerate(EXTREME_DOUBLES):
            conn.execute("INSERT INTO layer_stats (proc, step, module, type, calls, saved_bytes, saved_tensors,"
                         " output_bytes, forward_s, backward_s) VALUES (2, ?, 'x', 'x', 1, ?, 1, 2, ?, NULL)",
                         (20 + i, 2 ** 62 + i, seconds))
        conn.execute("INSERT INTO layer_stats (proc, step, module, type, calls, saved_bytes, saved_tensors,"
                     " output_bytes, forward_s) VALUES (2, 50, CAST(x'ff43' AS TEXT), x'00ff', 'x,\"y', 1, 1, 1, ?)",
                     ("nul\x00,text",))  # text and a blob where numbers belong: kept as they are
    return db


def stored(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows as sqlite3 reads them, text that is not UTF-8 with U+FFFD in place of the bad bytes."""
    conn = sqlite3.connect(db)
    conn.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def near(text: Decimal | str, exact: float, places: int) -> bool:
    """``text`` has ``places`` decimals and is ``exact`` rounded to them (to within SLACK)."""
    d = Decimal(text)
    unit = Fraction(1, 10**places)
    return d.as_tuple().exponent == -places and abs(Fraction(d) - Fraction(exact)) <= unit / 2 + SLACK * unit


# -- Chrome trace -----------------------------------------------------------------------------

def export_trace(db: Path, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    trace = tmp_path / "trace.json"
    out = memscope("export", str(db), "--chrome", str(trace))
    assert out.returncode == 0, out.stderr
    text = trace.read_bytes().decode()  # UTF-8, or this fails
    return text, json.loads(text, parse_float=Decimal)  # valid JSON, or this fails


def expected_series(db: Path) -> list[tuple[dict[str, Any], dict[str, float]]]:
    """The host-RSS and step events from the rows: (event less its times, the exact times)."""
    started, = stored(db, "SELECT started FROM run")[0]
    out: list[tuple[dict[str, Any], dict[str, float]]] = []
    for (pid,) in stored(db, "SELECT id FROM processes ORDER BY coalesce(rank, 0), id"):
        for t, rss in stored(db, "SELECT t, rss FROM samples WHERE proc = ? ORDER BY t, rowid", (pid,)):
            out.append(({"ph": "C", "name": "host RSS", "pid": pid, "tid": 0, "args": {"rss": rss}},
                        {"ts": (t - started) * 1e6}))
        for step, start, end, status, *peaks in stored(
                db, "SELECT step, start, end, status, peak_rss, peak_allocated, peak_reserved"
                    " FROM steps WHERE proc = ? ORDER BY step", (pid,)):
            args = {"step": step, "status": status}
            args.update({k: v for k, v in zip(chrome.PEAKS, peaks) if v is not None})
            out.append(({"ph": "X", "cat": "step", "name": f"step {step}", "pid": pid, "tid": 1, "args": args},
                        {"ts": (start - started) * 1e6, "dur": max(end - start, 0.0) * 1e6}))
    return out


def check_series(doc: dict[str, Any], db: Path) -> int:
    """The trace's host-RSS and step events are the rows' (same order, same values)."""
    written = [e for e in doc["traceEvents"] if e["name"] == "host RSS" or e.get("cat") == "step"]
    expected = expected_series(db)
    assert len(written) == len(expected)
    for event, (rest, times) in zip(written, expected):
        assert {k: v for k, v in event.items() if k not in times} == rest
        assert all(near(event[k], x, 3) for k, x in times.items()), (event, times)
    return len(written)


@pytest.mark.parametrize("which", ["real_run", "hostile_run"])
def test_chrome_trace_same_events_and_values(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    db: Path = request.getfixturevalue(which)
    text, doc = export_trace(db, tmp_path)
    lines = [ln.rstrip(",") for ln in text.split("\n")[1:-2]]  # one event a line (raw U+2028 is not a line end)
    assert len(lines) == len(doc["traceEvents"])
    assert check_series(doc, db) > 20


def test_chrome_trace_hostile_strings_exact(hostile_run: Path, tmp_path: Path) -> None:
    """Statuses and module names come back as stored; bytes that are not UTF-8 as U+FFFD."""
    _, doc = export_trace(hostile_run, tmp_path)
    statuses = {e["args"]["status"] for e in doc["traceEvents"] if e.get("cat") == "step"}
    assert set(HOSTILE) | {"\ufffdB", 'fä"il\\ed'} <= statuses
    ooms = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["cat"] == "oom" and e["pid"] == 2]
    assert [e["args"]["data"]["module"] for e in ooms] == HOSTILE
    assert [e["args"]["message"] for e in ooms] == HOSTILE
    assert any(e["args"].get("message") == "\ufffdD" for e in doc["traceEvents"] if e["ph"] == "i")


def test_chrome_trace_times_are_rounded_to_the_nanosecond(hostile_run: Path, tmp_path: Path) -> None:
    """Every ts and dur of the series is printed with three decimals (their values: within half a
    nanosecond of the exact value, SLACK aside, in check_series)."""
    _, doc = export_trace(hostile_run, tmp_path)
    times = [(e, k) for e in doc["traceEvents"] for k in ("ts", "dur") if k in e
             and (e["name"] == "host RSS" or e.get("cat") == "step")]
    assert times and all(isinstance(e[k], Decimal) and e[k].as_tuple().exponent == -3 for e, k in times)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_chunks_change_nothing(hostile_run: Path, tmp_path: Path, chunk: int,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk boundaries anywhere (between samples at the same instant too): the same text."""
    whole, _ = export_trace(hostile_run, tmp_path)
    monkeypatch.setattr(sql_text, "CHUNK", chunk)
    buf = io.StringIO()
    with RunReader(hostile_run) as reader:
        reader.conn.text_factory = sql_text.lenient_text
        chrome.write_chrome_trace(reader, buf)
        assert buf.getvalue().split("\n", 1)[1] == whole.split("\n", 1)[1]  # otherData names the path
        timeline = io.StringIO()
        csv_export.write_timeline(reader, timeline)
        tables = {t: io.StringIO() for t in ("samples", "steps", "layer_stats", "events")}
        for t, out in tables.items():
            csv_export.write_table(reader, t, out)
    monkeypatch.setattr(sql_text, "CHUNK", 16384)
    with RunReader(hostile_run) as reader:
        reader.conn.text_factory = sql_text.lenient_text
        again = io.StringIO()
        csv_export.write_timeline(reader, again)
        assert timeline.getvalue() == again.getvalue()
        for t, out in tables.items():
            again = io.StringIO()
            csv_export.write_table(reader, t, again)
            assert out.getvalue() == again.getvalue(), t


@pytest.mark.parametrize("chunk", [2, 16384])
def test_timeline_in_time_order_whatever_the_rowids(real_run: Path, tmp_path: Path, chunk: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The timeline takes each chunk's rowids in time order and each row by its rowid (csv_export
    own_rowid): rows stored latest first still come in time order, as the subquery that copies
    every row gives them; and so with a column named rowid (a file from elsewhere)."""
    db = tmp_path / "run.db"
    shutil.copy(real_run, db)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE copy AS SELECT * FROM samples ORDER BY t DESC, rowid DESC")
        conn.execute("DELETE FROM samples")
        conn.execute("INSERT INTO samples SELECT * FROM copy")
        conn.execute("DROP TABLE copy")
    monkeypatch.setattr(sql_text, "CHUNK", chunk)

    def timeline(own: bool) -> str:
        with monkeypatch.context() as m, RunReader(db) as reader:
            if not own:
                m.setattr(csv_export, "own_rowid", lambda columns: False)
            reader.conn.text_factory = sql_text.lenient_text
            out = io.StringIO()
            csv_export.write_timeline(reader, out)
            return out.getvalue()

    text = timeline(True)
    times = [float(line.split(",")[3]) for line in text.splitlines()[1:]]
    assert len(times) > 10 and times == sorted(times) and text == timeline(False)
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE samples ADD COLUMN rowid INTEGER DEFAULT 1")  # the same in every row
    assert not csv_export.own_rowid(["proc", "t", "rowid"])
    again = timeline(True)
    assert again == timeline(False) and (chunk == 2 or again == text)  # each row once


def test_a_chunk_sqlite_cannot_read_is_read_again_through_the_checks(real_run: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk SQLite fails to make (here the third chunk query of the samples raises, as a
    damaged page would) is read again, from its first row, through RunReader's rows: every event
    once, in order."""
    monkeypatch.setattr(sql_text, "CHUNK", 4)
    buf = io.StringIO()

    class Failing:  # the reader's connection, its third chunk query of the samples refused
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn, self.chunks = conn, 0

        def execute(self, sql: str, *args: Any) -> Any:
            if "group_concat" in sql and "FROM samples" in sql:
                self.chunks += 1
                if self.chunks == 3:
                    raise sqlite3.DatabaseError("database disk image is malformed")
            return self.conn.execute(sql, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.conn, name)

        def __setattr__(self, name: str, value: Any) -> None:
            if name in ("conn", "chunks"):
                object.__setattr__(self, name, value)
            else:
                setattr(self.conn, name, value)

    with RunReader(real_run) as reader:
        failing = Failing(reader.conn)
        reader.conn = failing  # type: ignore[assignment]
        chrome.write_chrome_trace(reader, buf)
    assert failing.chunks >= 3
    doc = json.loads(buf.getvalue(), parse_float=Decimal)
    assert check_series(doc, real_run) > 20


# -- CSV --------------------------------------------------------------------------------------

def cell(v: Any, text_column: bool = True) -> str:
    """What a stored value must read back as (csv.reader): a formula guarded by a leading '."""
    if v is None:
        return ""
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, str):
        if "\x00" in v and not text_column:  # text where a number belongs, with a NUL: as a blob
            return v.encode().hex()
        return "'" + v if v.startswith(FORMULA) else v
    return str(v)


def read_csv(path: Path) -> list[list[str]]:
    csv.field_size_limit(1 << 22)
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def check_table(db: Path, table: str, path: Path) -> int:
    """Every row and cell of ``table`` read back from its CSV file; returns REAL values checked."""
    declared = stored(db, f'SELECT name, type FROM pragma_table_info("{table}")')
    header, *rows = read_csv(path)
    assert header == [c for c, _ in declared]
    want = stored(db, f'SELECT * FROM "{table}" ORDER BY rowid')
    assert len(rows) == len(want), table
    reals = 0
    for got, row in zip(rows, want):
        assert len(got) == len(row)
        for text, v, (name, kind) in zip(got, row, declared):
            if isinstance(v, float):
                assert float(text) == v and re.fullmatch(r"-?[0-9.]+(e[-+][0-9]+)?|-?Inf", text), (table, name, text, v)
                reals += 1
            else:
                assert text == cell(v, kind.upper() not in ("INTEGER", "REAL")), (table, name, text, v)
    return reals


@pytest.mark.parametrize("which", ["real_run", "hostile_run"])
def test_csv_tables_read_back_exactly(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    db: Path = request.getfixturevalue(which)
    target = tmp_path / "csv"
    out = memscope("export", str(db), "--csv", str(target))
    assert out.returncode == 0, out.stderr
    tables = {r[0] for r in stored(db, "SELECT name FROM sqlite_master WHERE type = 'table'")} - {"migrations"}
    reals = {t: check_table(db, t, target / f"{t}.csv") for t in sorted(tables)}
    # every REAL column the real run fills was compared, value by value
    assert all(reals[t] >= 6 for t in ("steps", "samples", "layer_stats")), reals
    assert all(reals[t] >= 1 for t in ("run", "processes")), reals


def test_csv_tables_of_any_value_read_back_exactly(damaged_run: Path, tmp_path: Path) -> None:
    """The table writer formats any value a file can hold, misfits and extremes included (under
    RunReader.unchecked(): the export command itself refuses them, in one line)."""
    out = memscope("export", str(damaged_run), "--csv", str(tmp_path / "refused"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "damaged run file: layer_stats.forward_s holds 1e+300, out of range (0 to 1e+09)" in out.stderr
    for table in ("layer_stats", "steps", "samples"):
        with RunReader(damaged_run) as reader, reader.unchecked(), \
                open(tmp_path / f"{table}.csv", "w", newline="", encoding="utf-8") as f:
            reader.conn.text_factory = sql_text.lenient_text
            csv_export.write_table(reader, table, f)
        check_table(damaged_run, table, tmp_path / f"{table}.csv")
    layers = (tmp_path / "layer_stats.csv").read_text(encoding="utf-8")
    assert '"x,""y"' in layers and "e+300," in layers and "00ff" in layers


def test_csv_reals_through_python_where_sqlite_cannot(damaged_run: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Where this SQLite's float text would not parse back, a table's cells are Python's: the
    same values read back."""
    with sqlite3.connect(":memory:") as conn:
        assert sql_text.floats_round_trip(conn)  # this build: 4,000 doubles of every magnitude
    monkeypatch.setattr(csv_export, "floats_round_trip", lambda conn: False)
    path = tmp_path / "layer_stats.csv"
    with RunReader(damaged_run) as reader, reader.unchecked(), open(path, "w", newline="", encoding="utf-8") as f:
        reader.conn.text_factory = sql_text.lenient_text
        csv_export.write_table(reader, "layer_stats", f)
    # Python's csv writes a NUL in a number's column as it is, SQLite's path that text in hex
    rows = read_csv(path)
    assert any("nul\x00,text" in r for r in rows)


def test_timeline_reads_back(hostile_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "timeline.csv"
    out = memscope("export", str(hostile_run), "--csv", str(target))
    assert out.returncode == 0, out.stderr
    header, *rows = read_csv(target)
    assert header == csv_export.TIMELINE_COLUMNS
    started, = stored(hostile_run, "SELECT started FROM run")[0]
    want = []
    for pid, rank in stored(hostile_run, "SELECT id, rank FROM processes ORDER BY coalesce(rank, 0), id"):
        want += [(rank, pid, *r) for r in stored(
            hostile_run, "SELECT t, step, phase, rss FROM samples WHERE proc = ? ORDER BY t, rowid", (pid,))]
    assert len(rows) == len(want)
    for got, (rank, pid, t, step, phase, rss) in zip(rows, want):
        assert got[:2] == [cell(rank), str(pid)] and got[4:] == [cell(step), cell(phase), "rss", "host", str(rss)]
        assert near(got[2], t - started, 6) and near(got[3], t, 6), (got, t)
    phases = {r[5] for r in rows}
    assert {"'=HYPERLINK(1)", "a,b", 'q"uote', "new\nline", "'\r", "nul\x00byte", "\ufffdA", "'-1"} <= phases


def test_hostile_rows_are_really_there(hostile_run: Path, tmp_path: Path) -> None:
    """The hostile file exercises the quoting: its files hold quoted and guarded cells."""
    target = tmp_path / "csv"
    assert memscope("export", str(hostile_run), "--csv", str(target)).returncode == 0
    text = (target / "timeline.csv").read_text(encoding="utf-8")
    assert '"a,b"' in text and '"q""uote"' in text and "'=HYPERLINK(1)" in text and '"new\nline"' in text
    assert '"nul\x00byte"' in text
    layers = (target / "layer_stats.csv").read_text(encoding="utf-8")
    assert "e-300," in layers


# -- damage -----------------------------------------------------------------------------------

@pytest.mark.parametrize("sql, clean", [
    ("", True),
    ("UPDATE samples SET rss = 1.5 WHERE rowid = (SELECT max(rowid) FROM samples)", False),
    ("UPDATE samples SET rss = 'x' WHERE rowid = (SELECT min(rowid) FROM samples)", False),
    ("UPDATE samples SET t = 'soon' WHERE rowid = (SELECT min(rowid) FROM samples)", False),
    ("UPDATE samples SET t = 1e13 WHERE rowid = (SELECT min(rowid) FROM samples)", False),
    ("UPDATE samples SET t = x'00ff' WHERE rowid = (SELECT max(rowid) FROM samples)", False),
    ("UPDATE samples SET rss = 9223372036854775807", False),  # beyond any size (2**62)
])
def test_column_checks(real_run: Path, tmp_path: Path, sql: str, clean: bool) -> None:
    db = tmp_path / "run.db"
    shutil.copy(real_run, db)
    if sql:
        with sqlite3.connect(db) as conn:
            conn.execute(sql)
    with RunReader(db) as reader:
        if clean:
            reader.check_tables(["samples"])
        else:
            with pytest.raises(RunFileError, match="damaged run file: samples[.]"):
                reader.check_tables(["samples"])


@pytest.mark.parametrize("sql, message, options", [
    ("UPDATE samples SET rss = 1.5 WHERE rowid = (SELECT max(rowid) FROM samples)",
     "samples.rss holds 1.5, not an integer", ("--chrome", "--csv")),
    ("UPDATE samples SET t = 'soon' WHERE rowid = (SELECT max(rowid) FROM samples)",
     "samples.t holds text 'soon', not a number", ("--chrome", "--csv")),
    ("UPDATE steps SET status = x'00ff' WHERE rowid = (SELECT max(rowid) FROM steps)",
     "steps.status holds a blob of 2 bytes, not text", ("--chrome",)),
    ("UPDATE steps SET peak_rss = 2.5 WHERE rowid = (SELECT min(rowid) FROM steps)",
     "steps.peak_rss holds 2.5, not an integer", ("--chrome",)),
])
def test_damaged_series_still_named(real_run: Path, tmp_path: Path, sql: str, message: str,
                                    options: tuple[str, ...]) -> None:
    db = tmp_path / "run.db"
    shutil.copy(real_run, db)
    with sqlite3.connect(db) as conn:
        conn.execute(sql)
    for option in options:
        target = tmp_path / ("t.json" if option == "--chrome" else "t.csv")
        out = memscope("export", str(db), option, str(target))
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
        assert message in out.stderr
        assert not target.exists()


def test_text_that_is_not_utf8_is_replaced(real_run: Path, tmp_path: Path) -> None:
    """Flipped bytes in a text value: the export goes on, U+FFFD in place of the bad bytes (valid
    UTF-8, valid JSON), every other value as it was."""
    db = tmp_path / "run.db"
    shutil.copy(real_run, db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE samples SET phase = CAST(x'ff41' AS TEXT) WHERE rowid = (SELECT max(rowid) FROM samples)")
        conn.execute("UPDATE steps SET status = CAST(x'ff41' AS TEXT) WHERE rowid = (SELECT max(rowid) FROM steps)")
    out = memscope("export", str(db), "--csv", str(tmp_path / "timeline.csv"))
    assert out.returncode == 0, out.stderr
    rows = read_csv(tmp_path / "timeline.csv")
    assert [r[5] for r in rows if r[6] == "rss"][-1] == "\ufffdA"
    _, doc = export_trace(db, tmp_path)
    assert [e for e in doc["traceEvents"] if e.get("cat") == "step"][-1]["args"]["status"] == "\ufffdA"
    check_series(doc, db)

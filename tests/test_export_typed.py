"""A table's CSV file is made by a typed line where a chunk's values fit it, by the line for any
value from the first chunk that does not (memscope/report/table_text.py): the same bytes either
way. Checked on a real run, and on copies holding, one at a time, each kind of value that does not
fit; a marker in place of the line for any value shows which line made each chunk."""

from __future__ import annotations

import io
import shutil
import sqlite3
from pathlib import Path

import pytest

from memscope.report import csv_export, sql_text, table_text
from memscope.store.reader import RunReader

GENERIC = "'<any value>' || char(10)"  # a line for any value that shows where it was used


def export(db: Path, tables: list[str] | None = None) -> dict[str, str]:
    # unchecked: the writer's formatting of any value a file may hold, damage included (the
    # export command refuses a damaged value before formatting it: memscope/store/column_guard.py)
    with RunReader(db) as reader, reader.unchecked():
        reader.conn.text_factory = sql_text.lenient_text
        out = {}
        for table in tables or csv_export.tables(reader):
            buf = io.StringIO()
            csv_export.write_table(reader, table, buf)
            out[table] = buf.getvalue()
        return out


def untyped(db: Path, monkeypatch: pytest.MonkeyPatch, tables: list[str] | None = None) -> dict[str, str]:
    with monkeypatch.context() as m:
        m.setattr(csv_export, "typed_lines", lambda *args: [])
        return export(db, tables)


def marked(db: Path, monkeypatch: pytest.MonkeyPatch, tables: list[str]) -> dict[str, str]:
    with monkeypatch.context() as m:
        m.setattr(csv_export, "csv_line", lambda columns: GENERIC)
        return export(db, tables)


@pytest.mark.parametrize("chunk", [2, 16384])
def test_a_real_run_is_written_by_typed_lines(oom_example_run: Path, chunk: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql_text, "CHUNK", chunk)
    typed = export(oom_example_run)
    assert typed == untyped(oom_example_run, monkeypatch)
    big = [t for t, text in typed.items() if text.count("\n") > 3]
    assert {"steps", "samples", "layer_stats"} <= set(big)
    # every chunk of every table by a typed line, the words of its text columns found
    assert not any("<any value>" in text for text in marked(oom_example_run, monkeypatch, big).values())
    with RunReader(oom_example_run) as reader:
        line = table_text.typed_line(reader, '"samples"', table_text.columns_of(reader, '"samples"'))
        assert "other" in line.params.values()
        # a CPU run: the steps' CUDA columns as constant empty cells first
        learned, typed = table_text.typed_lines(reader, '"steps"', table_text.columns_of(reader, '"steps"'))
        assert '"peak_allocated"' in learned.check and '"peak_allocated"' in typed.line
        # a row of plain words (and a seldom NULL REAL set) through one printf, no || per cell
        for table in ("samples", "steps", "layer_stats"):
            first = table_text.typed_lines(reader, f'"{table}"', table_text.columns_of(reader, f'"{table}"'))[0]
            fast = first.line.split(" ELSE ")[0].split(" THEN ", 1)[1]
            assert first.line.startswith("CASE WHEN ") and fast.startswith("printf(") and ") || " not in fast


SQLITE_MAX = 9223372036854775807


def edit(db: Path, table: str, schema: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (schema, table))


@pytest.mark.parametrize("table, sql, any_value", [
    ("steps", "UPDATE steps SET peak_rss = 2.5 WHERE rowid = {mid}", True),  # a REAL in an INTEGER column
    ("steps", "UPDATE steps SET peak_rss = 'x,y' WHERE rowid = {mid}", True),  # text
    ("steps", "UPDATE steps SET peak_rss = x'00ff' WHERE rowid = {mid}", True),  # a blob
    ("steps", f"UPDATE steps SET peak_rss = {SQLITE_MAX} WHERE rowid >= {{mid}}", True),  # sum() overflows
    ("steps", "UPDATE steps SET start = 'soon' WHERE rowid = {mid}", True),  # text in a REAL NOT NULL column
    ("steps", "UPDATE steps SET start = NULL WHERE rowid = {mid}", True),  # NULL there
    ("layer_stats", "UPDATE layer_stats SET backward_s = x'00' WHERE rowid = {mid}", True),  # a blob in a nullable REAL
    ("layer_stats", "UPDATE layer_stats SET calls = NULL WHERE rowid = {mid}", False),  # NULL: no misfit
    ("steps", "UPDATE steps SET peak_allocated = 5 WHERE rowid >= {mid}", False),  # a value in a NULL column: typed
    ("samples", "UPDATE samples SET phase = 'other' || char(0) || 'x' WHERE rowid = {mid}", False),  # a word, NUL
    ("samples", "UPDATE samples SET phase = '=other' WHERE rowid = {mid}", False),  # a formula: guarded
    ("samples", "UPDATE samples SET phase = x'6f74686572' WHERE rowid = {mid}", False),  # 'other' as a blob
    ("samples", "UPDATE samples SET phase = 'OTHER' WHERE rowid = {mid}", False),  # equal to 'other' in NOCASE
    ("samples", "UPDATE samples SET phase = NULL WHERE rowid = {mid}", False),  # NULL among the words
    ("layer_stats", "UPDATE layer_stats SET backward_s = 'x' WHERE rowid = {mid}", True),  # text there
])
def test_values_that_do_not_fit_the_typed_line(oom_example_run: Path, tmp_path: Path, table: str, sql: str,
                                               any_value: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "run.db"
    shutil.copy(oom_example_run, db)
    with sqlite3.connect(db) as conn:
        mid = conn.execute(f"SELECT rowid FROM {table} ORDER BY rowid LIMIT 1 OFFSET 2").fetchone()[0]
        schema = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    # a file from elsewhere: its schema edited around the change (NOT NULL lifted, then declared
    # again: the reader checks declarations; a collation it does not check)
    edit(db, table, schema.replace(" NOT NULL", "").replace("phase TEXT", "phase TEXT COLLATE NOCASE"))
    with sqlite3.connect(db) as conn:
        conn.execute(sql.format(mid=mid))
    edit(db, table, schema.replace("phase TEXT", "phase TEXT COLLATE NOCASE"))
    monkeypatch.setattr(sql_text, "CHUNK", 2)
    assert export(db, [table]) == untyped(db, monkeypatch, [table])
    lines = marked(db, monkeypatch, [table])[table].split("\n")[1:-1]
    if not any_value:  # fits a typed line (a text cell that is not a plain word is written by
        assert "<any value>" not in lines  # the typed line as by the other)
        return
    # typed up to the chunk that holds the misfit, the line for any value from there on
    first = lines.index("<any value>")
    assert 2 <= first <= 3 and set(lines[first:]) == {"<any value>"}


@pytest.mark.parametrize("word, value", [("0.1", "0.1"), ("5", "5"), ("ab", "x'6162'")])
def test_a_number_or_blob_equal_to_a_word(oom_example_run: Path, tmp_path: Path, word: str, value: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A REAL, an integer or a blob in a text column, equal to one of its words as SQLite compares
    a TEXT column (the number as text), is written as its type is (0.1: 18 digits), not as the word."""
    db = tmp_path / "run.db"
    shutil.copy(oom_example_run, db)
    with sqlite3.connect(db) as conn:
        schema = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'samples'").fetchone()[0]
    edit(db, "samples", schema.replace("phase TEXT", "phase"))  # no affinity: the value stays as it is
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE samples SET phase = ? WHERE rowid % 2 = 0", (word,))
        conn.execute(f"UPDATE samples SET phase = {value} WHERE rowid = (SELECT max(rowid) FROM samples)")
    edit(db, "samples", schema)
    with monkeypatch.context() as m:
        m.setattr(sql_text, "CHUNK", 16384)
        with RunReader(db) as reader:
            columns = table_text.columns_of(reader, '"samples"')
            assert word in table_text.typed_line(reader, '"samples"', columns).params.values()
    typed = export(db, ["samples"])
    assert typed == untyped(db, monkeypatch, ["samples"])
    last = typed["samples"].splitlines()[-1].split(",")[3]
    assert last == {"0.1": "0.100000000000000006", "5": "5", "ab": "6162"}[word]


def test_a_seldom_null_real(oom_example_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A nullable REAL column with a value in most rows of the first chunk goes through the row's
    printf; its NULL rows are written by the rest of the typed line (an empty cell, never 0.0)."""
    db = tmp_path / "run.db"
    shutil.copy(oom_example_run, db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE layer_stats SET module = 'm' || rowid, backward_s = 0.5")
        conn.execute("UPDATE layer_stats SET backward_s = NULL WHERE rowid = (SELECT max(rowid) FROM layer_stats)")
    with RunReader(db) as reader:
        line = table_text.typed_lines(reader, '"layer_stats"', table_text.columns_of(reader, '"layer_stats"'))[0]
        assert '"backward_s" IS NOT NULL' in line.line.split(" THEN ")[0]  # the row's printf's condition
    typed = export(db, ["layer_stats"])
    assert typed == untyped(db, monkeypatch, ["layer_stats"])
    assert typed["layer_stats"].splitlines()[-1].split(",")[9] == ""
    assert not any("<any value>" in text for text in marked(db, monkeypatch, ["layer_stats"]).values())


def test_a_column_named_rowid(oom_example_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table with a column named ``rowid`` (a file from elsewhere): "rowid" is that column, so
    its chunks are taken in that column's order by the subquery, as ever; a chunk as one scan of a
    rowid range (``own_rowid``) is for the table's own rowid only."""
    db = tmp_path / "run.db"
    shutil.copy(oom_example_run, db)
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE steps ADD COLUMN rowid INTEGER")
        conn.execute("UPDATE steps SET rowid = -step")  # the column's order against the table's
    monkeypatch.setattr(sql_text, "CHUNK", 2)
    lines = export(db, ["steps"])["steps"].splitlines()
    assert lines[0].endswith(",rowid") and len(lines) > 3
    assert [int(line.split(",")[-1]) for line in lines[1:]] == sorted(int(line.split(",")[-1]) for line in lines[1:])

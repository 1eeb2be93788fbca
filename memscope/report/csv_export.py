"""A run file as CSV: the memory timeline in one file, or every table in a directory.

* ``timeline.csv`` (or any ``*.csv`` path, or ``-``): every memory reading in long format,
  one row per reading, grouped by process and metric and time-ordered within a group::

      rank,proc,time_s,unix_time,step,phase,metric,device,bytes
      ,1,0.412000,1763759853.412000,0,other,rss,host,237023232

  ``metric`` is ``rss`` (host resident memory), ``cuda_allocated``/``cuda_reserved`` (allocator
  bytes, ``device`` ``cuda:N``) or ``nvml_used`` (device memory used, as NVML reports it).
* a directory: ``timeline.csv`` plus one ``<table>.csv`` per table of the run file, with the
  file's own column names (so a spreadsheet sees the same data as SQL would).

Rows are streamed from SQLite, their text made there a chunk at a time (memscope/report/
sql_text.py, a table's typed where its values allow: table_text.py): nothing is held in memory.
Integers are exact; a table's REAL has 18 significant digits (it reads back to the same double);
timeline times are rounded to the microsecond. A directory's files are written side by side, one
a core (file_lanes.py), each through a new file renamed into place.

A run file can come from someone else: only the tables memscope's schema knows are written (a
table name never becomes a path), every file lands inside the directory (a symlink there is
replaced, not followed), and a text cell that a spreadsheet would run as a formula (it starts
with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) gets a leading ``'`` (OWASP's rule);
numbers stay numbers.
"""

from __future__ import annotations

import csv
import io
import os
import sqlite3
from typing import Any, Callable, Iterator, TextIO

from memscope.errors import UserError
from memscope.report.file_lanes import Job, write_files
from memscope.safe_files import make_dir
from memscope.report.sql_text import (FORMULA_START, Unchecked, after_key, csv_line, csv_text, floats_round_trip,
                                       joined_chunks, write_chunk)
from memscope.report.table_text import columns_of, typed_lines
from memscope.store.reader import RunReader
from memscope.store.schema import SCHEMA_VERSION, expected_tables

TIMELINE_TABLES = ("samples", "cuda_samples", "cuda_samples", "nvml_samples")  # its rows' (cuda: 2 a row)
TIMELINE_COLUMNS = ["rank", "proc", "time_s", "unix_time", "step", "phase", "metric", "device",
                    "bytes"]
SKIP_TABLES = {"migrations"}  # schema bookkeeping, not run data
BATCH = 8192  # rows fetched, formatted and written at a time
PLAIN_PHASES = ("forward", "backward", "optimizer", "other", "store", "capture")  # the agent's


def timeline_blocks(reader: RunReader) -> Iterator[tuple[str | bytes, int]]:
    """``timeline.csv`` less its header, as blocks of lines (text, rows)."""
    run = reader.run()
    origin = run["started"] if run and run["started"] is not None else \
        (reader.scalar("SELECT min(t) FROM samples") or 0.0)
    for p in reader.processes():
        rank, proc = p["rank"], p["id"]

        def row(t: float, step: Any, phase: Any, metric: str, device: str, value: Any,
                rank: Any = rank, proc: Any = proc) -> list[Any]:
            return [_blank(rank), proc, f"{t - origin:.6f}", f"{t:.6f}", _blank(step),
                    _cell(phase), metric, device, int(value)]

        yield from _sample_lines(reader, proc, origin, _line([_blank(rank), proc])[:-1], row)
        # the GPU series, streamed a block at a time (a week of 20 Hz CUDA samples is millions
        # of rows: never a list of them all)
        lines: list[str] = []
        for metric, sql in (
                ("cuda_allocated", "SELECT t, device, allocated FROM cuda_samples WHERE proc = ?"
                                   " AND allocated IS NOT NULL ORDER BY device, t"),
                ("cuda_reserved", "SELECT t, device, reserved FROM cuda_samples WHERE proc = ?"
                                  " AND reserved IS NOT NULL ORDER BY device, t"),
                ("nvml_used", "SELECT t, device, used FROM nvml_samples WHERE proc = ? AND used IS NOT NULL"
                              " ORDER BY device, t")):
            for t, device, value in reader.rows(sql, (proc,)):
                lines.append(_line(row(t, None, None, metric, f"cuda:{device}", value)))
                if len(lines) == BATCH:
                    yield "".join(lines), BATCH
                    lines = []
        if lines:
            yield "".join(lines), len(lines)


def _sample_lines(reader: RunReader, proc: int, origin: float, head: str,
                  row: Callable[..., list[Any]]) -> Iterator[tuple[str | bytes, int]]:
    """One process's host samples as CSV lines, made by SQLite a chunk at a time (times rounded
    to the microsecond by printf; the phase quoted and guarded in SQL), a damaged row and what
    follows it through RunReader's checks (which name the damage)."""
    # the agent's own phase words need no quoting: one printf; any other phase is quoted and
    # guarded in SQL and joined with || (printf's %s would end it at a NUL character)
    line = (f"CASE WHEN phase IN ({', '.join(repr(p) for p in PLAIN_PHASES)})"
            f" THEN printf('%s,%.6f,%.6f,%s,%s,rss,host,%d' || char(10), :head, t - :origin, t, step, phase, rss)"
            f" ELSE printf('%s,%.6f,%.6f,%s,', :head, t - :origin, t, step) || coalesce({csv_text('phase')}, '')"
            f" || printf(',rss,host,%d' || char(10), rss) END")
    key = ("t", "rowid")
    try:
        yield from joined_chunks(reader, line, "samples", "proc = :proc", key,
                                 {"head": head, "origin": origin, "proc": proc}, "",
                                 own_rowid=own_rowid(reader.columns("samples")))
        return
    except Unchecked as damaged:
        cond, after = after_key(key, damaged.after)
    for t, step, phase, rss in reader.rows(
            f"SELECT t, step, phase, rss FROM samples WHERE proc = ?{cond} ORDER BY t, rowid", (proc, *after)):
        yield _line(row(t, step, phase, "rss", "host", rss)), 1


def _line(cells: list[Any]) -> str:
    """One CSV line as csv.writer writes it."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cells)
    return buf.getvalue()


def write_timeline(reader: RunReader, out: TextIO) -> int:
    """Write ``timeline.csv`` to ``out``; return the number of data rows. Its tables are checked
    whole before its first byte (a timeline streamed to stdout is never half written)."""
    reader.check_tables(("run", "processes", *TIMELINE_TABLES))
    csv.writer(out, lineterminator="\n").writerow(TIMELINE_COLUMNS)
    n = 0
    for text, count in timeline_blocks(reader):
        write_chunk(out, text)
        n += count
    return n


def tables(reader: RunReader) -> list[str]:
    """The run file's tables that memscope's schema knows (any other table is not ours: its
    name could be ``../../x``), in name order."""
    known = set(expected_tables(SCHEMA_VERSION)) - SKIP_TABLES
    names = [r["name"] for r in reader.query(
        "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return [n for n in names if n in known]


def write_table(reader: RunReader, table: str, out: TextIO) -> int:
    """Write one table (its own columns, rowid order) to ``out``; return the number of rows."""
    if table not in tables(reader):  # names come from sqlite_master only: nothing to inject
        raise ValueError(f"no table {table!r} in {reader.path}")
    columns = reader.columns(table)
    csv.writer(out, lineterminator="\n").writerow(columns)
    if not columns:
        return 0
    n = 0
    cond, after = "", ()
    if floats_round_trip(reader.conn):
        # each line made by SQLite (what _cell and csv.writer do, per value, in C), a chunk of
        # lines joined there; a REAL as 18 significant digits, which parse back to its double.
        # The typed line first (memscope/report/table_text.py), the line for any value after a
        # chunk that it does not fit: the same text
        declared = columns_of(reader, _quoted(table))
        line = csv_line([(c.name, c.declared not in ("INTEGER", "REAL")) for c in declared])
        typed = typed_lines(reader, _quoted(table), declared)
        first, check, checked, params = typed[0] if typed else (line, "1", (), {})
        fallback = (*((t.line, t.check) for t in typed[1:]), (line, "1")) if typed else ()
        try:
            for text, count in joined_chunks(reader, first, _quoted(table), "1", ("rowid",), params, "", check,
                                             checked, fallback=fallback, own_rowid=own_rowid(columns)):
                write_chunk(out, text)
                n += count
            return n
        except Unchecked as refused:  # SQLite could not read a chunk: the row reads say why
            cond, after = after_key(("rowid",), refused.after)
    # csv.writer writes each REAL as Python's repr (this SQLite's float text may not parse back)
    w = csv.writer(out, lineterminator="\n")
    cells_sql = ", ".join(_sql_cell(c) for c in columns)
    for batch in reader.batches(f"SELECT {cells_sql} FROM {_quoted(table)} WHERE 1{cond} ORDER BY rowid",
                                after, BATCH, checked=False):
        w.writerows(batch)
        n += len(batch)
    return n


def own_rowid(columns: list[str]) -> bool:
    """Whether ``rowid`` is the table's own (no column named as it is: a file from elsewhere
    can have one, and then "rowid" is that column, its rows taken in that column's order)."""
    return not {c.lower() for c in columns} & {"rowid", "oid", "_rowid_"}


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_cell(column: str) -> str:
    """:func:`_cell` as an SQL expression over ``column``."""
    q = _quoted(column)
    starts = ", ".join(f"char({ord(c)})" for c in FORMULA_START)
    return (f"CASE WHEN typeof({q}) = 'text' AND substr({q}, 1, 1) IN ({starts}) THEN char(39) || {q}"
            f" WHEN typeof({q}) = 'blob' THEN lower(hex({q})) ELSE {q} END")


def write_directory(reader: RunReader, directory: str, group_readable: bool = False,
                    progress: Callable[[str], None] | None = None) -> dict[str, int]:
    """``timeline.csv`` and one CSV per known table into ``directory`` (created 0700, 0750 for
    group read, if missing; its parent must exist). Refuses a ``directory`` that is a file or a
    symbolic link. Returns {file name: data rows}."""
    if os.path.islink(directory.rstrip(os.sep) or directory):  # "link/" follows the link
        raise UserError(f"export: --csv {directory}: is a symbolic link; give the directory itself")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UserError(f"export: --csv {directory}: exists and is not a directory")
    make_dir(directory, group_readable)
    jobs = [Job("timeline.csv", 8 * sum(_rows(reader, t) for t in TIMELINE_TABLES))]
    jobs += [Job(f"{t}.csv", len(reader.columns(t)) * _rows(reader, t)) for t in tables(reader)]
    return write_files(reader, directory, jobs, f"{__name__}:write_named", group_readable=group_readable,
                       progress=progress)


def write_named(reader: RunReader, name: str, out: TextIO) -> int:
    """Write the directory's file ``name`` (``timeline.csv`` or ``TABLE.csv``) to ``out``."""
    if name == "timeline.csv":
        return write_timeline(reader, out)
    return write_table(reader, name.removesuffix(".csv"), out)


def _rows(reader: RunReader, table: str) -> int:
    """About how many rows ``table`` holds (its largest rowid: no scan); 0 if unknown."""
    try:
        return int(reader.conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {_quoted(table)}").fetchone()[0])
    except (sqlite3.Error, TypeError, ValueError):
        return 0


def _cell(v: Any) -> Any:
    """A value as a CSV cell: NULL empty; text a spreadsheet would evaluate (``=HYPERLINK(...)``)
    with a leading ``'``; numbers as they are."""
    if v is None:
        return ""
    if isinstance(v, str) and v.startswith(FORMULA_START):
        return "'" + v
    if isinstance(v, bytes):  # a BLOB: shown as hex, never raw bytes
        return v.hex()
    return v


def _blank(v: Any) -> Any:
    """NULL as an empty cell (csv would write ``None``)."""
    return "" if v is None else v

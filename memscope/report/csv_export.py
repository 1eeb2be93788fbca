"""A run file as CSV: the memory timeline in one file, or every table in a directory.

* ``timeline.csv`` (or any ``*.csv`` path, or ``-``): every memory reading in long format,
  one row per reading, grouped by process and metric and time-ordered within a group::

      rank,proc,time_s,unix_time,step,phase,metric,device,bytes
      ,1,0.412,1763759853.412,0,other,rss,host,237023232

  ``metric`` is ``rss`` (host resident memory), ``cuda_allocated``/``cuda_reserved`` (allocator
  bytes, ``device`` ``cuda:N``) or ``nvml_used`` (device memory used, as NVML reports it).
* a directory: ``timeline.csv`` plus one ``<table>.csv`` per table of the run file, with the
  file's own column names (so a spreadsheet sees the same data as SQL would).

Rows are streamed from SQLite: nothing is held in memory.
"""

from __future__ import annotations

import csv
import os
from typing import Any, Iterator, TextIO

from memscope.store.reader import RunReader

TIMELINE_COLUMNS = ["rank", "proc", "time_s", "unix_time", "step", "phase", "metric", "device",
                    "bytes"]
SKIP_TABLES = {"migrations"}  # schema bookkeeping, not run data


def timeline_rows(reader: RunReader) -> Iterator[list[Any]]:
    """The rows of ``timeline.csv`` (without the header)."""
    run = reader.run()
    origin = run["started"] if run and run["started"] is not None else \
        (reader.scalar("SELECT min(t) FROM samples") or 0.0)
    for p in reader.processes():
        rank, proc = p["rank"], p["id"]

        def row(t: float, step: Any, phase: Any, metric: str, device: str, value: Any,
                rank: Any = rank, proc: Any = proc) -> list[Any]:
            return [_blank(rank), proc, f"{t - origin:.6f}", f"{t:.6f}", _blank(step),
                    _blank(phase), metric, device, int(value)]

        for t, step, phase, rss in reader.conn.execute(
                "SELECT t, step, phase, rss FROM samples WHERE proc = ? ORDER BY t", (proc,)):
            yield row(t, step, phase, "rss", "host", rss)
        for metric, column in (("cuda_allocated", "allocated"), ("cuda_reserved", "reserved")):
            for t, device, value in reader.conn.execute(
                    f"SELECT t, device, {column} FROM cuda_samples WHERE proc = ?"
                    f" AND {column} IS NOT NULL ORDER BY device, t", (proc,)):
                yield row(t, None, None, metric, f"cuda:{device}", value)
        for t, device, used in reader.conn.execute(
                "SELECT t, device, used FROM nvml_samples WHERE proc = ? AND used IS NOT NULL"
                " ORDER BY device, t", (proc,)):
            yield row(t, None, None, "nvml_used", f"cuda:{device}", used)


def write_timeline(reader: RunReader, out: TextIO) -> int:
    """Write ``timeline.csv`` to ``out``; return the number of data rows."""
    w = csv.writer(out, lineterminator="\n")
    w.writerow(TIMELINE_COLUMNS)
    n = 0
    for r in timeline_rows(reader):
        w.writerow(r)
        n += 1
    return n


def tables(reader: RunReader) -> list[str]:
    names = [r["name"] for r in reader.query(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        " ORDER BY name")]
    return [n for n in names if n not in SKIP_TABLES]


def write_table(reader: RunReader, table: str, out: TextIO) -> int:
    """Write one table (its own columns, rowid order) to ``out``; return the number of rows."""
    if table not in tables(reader):  # names come from sqlite_master only: nothing to inject
        raise ValueError(f"no table {table!r} in {reader.path}")
    cur = reader.conn.execute(f'SELECT * FROM "{table}"')
    w = csv.writer(out, lineterminator="\n")
    w.writerow([d[0] for d in cur.description])
    n = 0
    for r in cur:
        w.writerow([_blank(v) for v in r])
        n += 1
    return n


def write_directory(reader: RunReader, directory: str) -> dict[str, int]:
    """``timeline.csv`` and one CSV per table into ``directory`` (created if missing; its
    parent must exist). Returns {file name: data rows}."""
    os.makedirs(directory, exist_ok=True)
    written: dict[str, int] = {}
    with open(os.path.join(directory, "timeline.csv"), "w", newline="", encoding="utf-8") as f:
        written["timeline.csv"] = write_timeline(reader, f)
    for table in tables(reader):
        name = f"{table}.csv"
        with open(os.path.join(directory, name), "w", newline="", encoding="utf-8") as f:
            written[name] = write_table(reader, table, f)
    return written


def _blank(v: Any) -> Any:
    """NULL as an empty cell (csv would write ``None``)."""
    return "" if v is None else v

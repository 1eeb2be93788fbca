"""RunReader's per-value damage checks, for whole columns at once, aggregated in SQL.

An export of a million rows would spend a second in :meth:`RunReader.rows`' checks, a Python step
per value. One aggregate pass answers the same question for a process's rows: every value of the
right type, within the bounds, and present where the schema says NOT NULL. When it says yes the
caller reads the rows unchecked (``checked=False``); when it says no, it reads them through the
checks as before, which name the damage in one line. An export that makes its text in SQL
evaluates the same condition (:func:`clean_sql`) per chunk of the rows it writes, in the query
that writes them (no pass of its own).

    if columns_clean(reader, "samples", proc, times=("t",), ints=("rss",)):
        ...fast path...

How each check is one aggregate: text or a blob sorts above any number in SQLite, so the maximum
of a numeric column is a number only if every value is; ``sum()`` is an integer only if every
value is one (a REAL, text or blob makes it REAL; an overflow is an error, taken as "not clean");
a text column's minimum and maximum are text only if every value is.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from memscope.store.reader import _BOUNDS
from memscope.store.step_stats import scan_source

if TYPE_CHECKING:
    from memscope.store.reader import RunReader

# RunReader's bounds for the columns the exports read (one table of bounds, not a copy)
BOUNDS = {c: _BOUNDS[c] for c in ("t", "start", "end", "step")}


def columns_clean(reader: "RunReader", table: str, proc: int, times: tuple[str, ...] = (),
                  ints: tuple[str, ...] = (), texts: tuple[str, ...] = (),
                  nullable: tuple[str, ...] = ()) -> bool:
    """Whether every row of ``proc`` in ``table`` passes RunReader's checks for these columns:
    ``times`` REAL or INTEGER, ``ints`` INTEGER, ``texts`` TEXT; none NULL unless ``nullable``."""
    sql = (f"SELECT {clean_sql(times, ints, texts, nullable)} FROM {scan_source(reader, table)}"
           " WHERE proc = ?")
    try:
        row = reader.conn.execute(sql, (proc,)).fetchone()
    except sqlite3.Error:  # an integer overflow in sum(), a damaged page: the checked path says which
        return False
    return bool(row and row[0])


def clean_sql(times: tuple[str, ...] = (), ints: tuple[str, ...] = (), texts: tuple[str, ...] = (),
              nullable: tuple[str, ...] = ()) -> str:
    """The aggregate condition :func:`columns_clean` evaluates, over any set of rows (an export
    evaluates it per chunk of the rows it writes). It may fail with an integer overflow in
    ``sum()``: not clean either."""
    conds = []
    for c in (*times, *ints, *texts):
        q = f'"{c}"'
        if c not in nullable:  # count() per column: cheaper than one max() over an OR of IS NULLs
            conds.append(f"count({q}) = count(*)")
        if c in texts:
            conds.append(f"coalesce(typeof(min({q})) = 'text' AND typeof(max({q})) = 'text', 1)")
        elif c in ints:
            conds.append(f"typeof(sum({q})) IN ('integer', 'null')")
        else:
            conds.append(f"typeof(max({q})) IN ('real', 'integer', 'null')")
        if c in BOUNDS:
            b = BOUNDS[c]
            conds.append(f"coalesce(min({q}) >= {-b!r} AND max({q}) <= {b!r}, 1)")
    return " AND ".join(conds) or "1"

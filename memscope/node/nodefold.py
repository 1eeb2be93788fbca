"""A node file sized by time, not by samples: old samples folded into windows.

As memscope/store/fold.py does for a long run's steps: recent samples stay whole (the growth
rule and the live view need them); older ones are folded, per process, into one row per window
of wall time, which keeps the lowest and the highest level of the samples it covers (the lower
envelope the growth rule reads, and the peaks) and their count. The tiers, by age:

- the last ``RAW_S`` (an hour): every sample;
- up to ``TIERS[1]``'s age (two days): one row per minute;
- up to thirty days: one row per hour; older: one row per day.

So a process watched for a year at one sample every 5 s costs about 4,500 rows, not six million.
The samples of a process that ended more than ``KEEP_ENDED_S`` ago are dropped (its process row
keeps its peaks, the events keep what was flagged and attached).
"""

from __future__ import annotations

import sqlite3

from memscope.store.fold import _env  # the same reading of a tuning variable


RAW_S = _env("MEMSCOPE_NODE_RAW_S", 3600.0)
# (age beyond which samples are folded, window width), youngest first
TIERS = ((RAW_S, 60.0), (2 * 86400.0, 3600.0), (30 * 86400.0, 86400.0))
KEEP_ENDED_S = _env("MEMSCOPE_NODE_KEEP_ENDED_S", 30 * 86400.0)
FOLD_EVERY_S = 60.0  # how often the daemon folds


def fold(conn: sqlite3.Connection, now: float) -> int:
    """Fold what is due, in one transaction; returns how many rows the samples table lost."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        before = int(conn.execute("SELECT count(*) FROM samples").fetchone()[0])
        conn.execute("DELETE FROM samples WHERE proc IN (SELECT id FROM processes WHERE ended IS NOT NULL"
                     " AND ended < ?)", (now - KEEP_ENDED_S,))
        for age, width in TIERS:
            _fold_tier(conn, now - age, width)
        after = int(conn.execute("SELECT count(*) FROM samples").fetchone()[0])
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return before - after


def _fold_tier(conn: sqlite3.Connection, cutoff: float, width: float) -> None:
    """Rows that ended before ``cutoff`` and are narrower than ``width``, merged per process and
    window (a window's rows folded earlier merge with the ones that join it later)."""
    where = "t_end < ? AND t_end - t < ?"
    groups = conn.execute(
        "SELECT proc, min(t), max(t_end), sum(n), min(rss_min), max(rss_max), min(gpu_min), max(gpu_max),"
        f" count(*) FROM samples WHERE {where} GROUP BY proc, CAST(t / ? AS INTEGER)",
        (cutoff, width, width)).fetchall()
    if not any(g[8] > 1 for g in groups):
        return
    conn.execute(f"DELETE FROM samples WHERE {where}", (cutoff, width))
    conn.executemany("INSERT INTO samples (proc, t, t_end, n, rss_min, rss_max, gpu_min, gpu_max)"
                     " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [g[:8] for g in groups])

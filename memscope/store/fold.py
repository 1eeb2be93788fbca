"""Run files sized by time, not by steps: folding uneventful steps into per-window rows.

A step row costs about 60 bytes; at thousands of steps a second that is a gigabyte an hour. Once
a process has recorded ``FOLD_AFTER`` steps, its writer (every ``FOLD_EVERY_S``) replaces each run
of consecutive uneventful steps that closed in the same ``WINDOW_S`` of wall time by one
``step_windows`` row (count, first and last step, duration min/max/sum, the highest per-step peak
and its step, the lowest level at a boundary and its step). About one window per second of
training (a window also ends at a kept step): under half a megabyte an hour at any step rate.

Kept whole, always: the first ``FOLD_AFTER`` steps; the last ``TAIL`` steps; every step within
``NEAR`` steps of a failed step (an OOM), an event, an inventory or a leak-holder search; the
profiled steps whose layer rows stay (one per ``PROFILE_EVERY_S`` of wall time and the two
nearest each kept peak; the layer rows of the others are dropped); and within ``NEAR`` steps of
a new peak (a step whose peak_rss or peak_allocated beats every step before it by
``PEAK_MARGIN``, and the highest step of each fold, so the run's peak step - the earliest step
with the highest peak - is always a kept row). Sums of counts and maxima of maxima give every
number a reader shows from steps exactly (count, peak and its step, mean duration); the median
step time is then computed from the kept steps and the windows' means.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any


def _env(name: str, default: float) -> float:
    try:
        value = float(os.environ[name])
    except (KeyError, ValueError):
        return default
    return value if value > 0 else default


FOLD_AFTER = int(_env("MEMSCOPE_FOLD_AFTER", 2000))  # steps kept whole before folding starts
WINDOW_S = _env("MEMSCOPE_FOLD_WINDOW_S", 1.0)  # wall time one window covers at most
FOLD_EVERY_S = _env("MEMSCOPE_FOLD_EVERY_S", 5.0)  # how often the writer folds
NEAR = 8  # steps kept on each side of something a reader looks at
TAIL = int(_env("MEMSCOPE_FOLD_TAIL", 256))  # the last steps stay whole (recent steps, the run's end)
PEAK_MARGIN = 0.01  # a new high counts as a peak when 1% above the last one kept
# layer profiles (every 50th step by default) kept at most one per this many seconds of wall
# time, besides those nearest a peak: at thousands of steps a second they are most of the file
PROFILE_EVERY_S = _env("MEMSCOPE_FOLD_PROFILE_S", 60.0)

# steps a reader looks at, whose neighbours stay whole; profiled steps (every 50th by default)
# keep only themselves: their neighbours would be a third of the run
_MARKERS = ("events", "inventories", "leak_holders")
_PROFILED = ("step_breakdown", "layer_stats")
_PEAKS = ("peak_rss", "peak_allocated")


@dataclass
class FoldState:
    """What one process's writer remembers between folds."""

    done: int = -1  # every step up to here has been decided (kept or folded)
    highs: dict[str, int] = field(default_factory=dict)  # highest peak per column so far
    kept_highs: dict[str, int] = field(default_factory=dict)  # level of the last peak kept
    ahead: set[int] = field(default_factory=set)  # later steps a fold already said to keep
    peak_steps: list[int] = field(default_factory=list)  # the peaks kept, in order
    profile_bucket: float | None = None  # the wall-time bucket of the last profile kept
    deferred: int | None = None  # the latest profiled step, decided once the next one is seen
    thinned: int = 0  # profiled steps whose layer rows were dropped
    folded: int = 0  # steps folded so far
    windows: int = 0  # windows written so far


def fold(conn: sqlite3.Connection, proc: int, state: FoldState) -> int:
    """Fold what is due of ``proc``'s steps, in one transaction; returns the steps folded.
    Raises sqlite3.Error (rolled back) when the file refuses: the next fold tries again."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        n = _fold(conn, proc, state)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return n


def _fold(conn: sqlite3.Connection, proc: int, state: FoldState) -> int:
    top = conn.execute("SELECT max(step) FROM steps WHERE proc = ?", (proc,)).fetchone()[0]
    if top is None:
        return 0
    lo, hi = max(state.done + 1, FOLD_AFTER), int(top) - TAIL
    if hi < lo:
        return 0
    if not state.highs:  # the first fold: the highs of the steps kept whole before it
        for col in _PEAKS:
            v = conn.execute(f"SELECT max({col}) FROM steps WHERE proc = ? AND step < ?",
                             (proc, lo)).fetchone()[0]
            if v is not None:
                state.highs[col] = state.kept_highs[col] = int(v)
    rows = conn.execute(
        "SELECT step, start, end, peak_rss, peak_allocated, peak_reserved, end_rss, end_allocated,"
        " status FROM steps WHERE proc = ? AND step BETWEEN ? AND ? ORDER BY step",
        (proc, lo, hi)).fetchall()
    peaks = _peaks(rows, state)
    state.peak_steps.extend(sorted(peaks))
    keep = state.ahead | _profiles(conn, proc, state, lo, hi) | _near(
        _markers(conn, proc, lo - NEAR, hi + NEAR, _MARKERS) | peaks
        | {r[0] for r in rows if r[8] != "ok"})
    windows = _windows([r for r in rows if r[0] not in keep and r[8] == "ok"])
    folded = 0
    for w in windows:
        conn.execute(_INSERT, (proc, *w))
        conn.execute("DELETE FROM steps WHERE proc = ? AND step BETWEEN ? AND ?", (proc, w[0], w[1]))
        folded += w[2]
    state.done = hi
    state.ahead = {s for s in keep if s > hi}
    state.folded += folded
    state.windows += len(windows)
    return folded


def _profiles(conn: sqlite3.Connection, proc: int, state: FoldState, lo: int, hi: int) -> set[int]:
    """The profiled steps up to ``hi`` whose layer rows stay: the first of each PROFILE_EVERY_S
    of wall time, and the two nearest each kept peak (the hotspots and the breakdown a report
    shows come from the profile nearest the peak step). The latest waits for the next fold (a
    peak after it may need it); the layer rows of the others are dropped, their steps fold."""
    first = lo if state.deferred is None else state.deferred
    profiled = sorted(_markers(conn, proc, first, hi, _PROFILED))
    if not profiled:
        return set()
    before = conn.execute("SELECT max(step) FROM step_breakdown WHERE proc = ? AND step < ?",
                          (proc, first)).fetchone()[0]
    starts = dict(conn.execute(f"SELECT step, start FROM steps WHERE proc = ? AND step IN "
                               f"({', '.join('?' * len(profiled))})", (proc, *profiled)).fetchall())
    keep = {profiled[-1]}
    state.deferred = profiled[-1]
    for i, step in enumerate(profiled[:-1]):
        prev, nxt = profiled[i - 1] if i else before, profiled[i + 1]
        near_peak = any((prev is None or prev < p) and p < nxt for p in state.peak_steps)
        start = starts.get(step)
        bucket = None if start is None else start // PROFILE_EVERY_S
        if near_peak or bucket is None or bucket != state.profile_bucket:
            keep.add(step)
            state.profile_bucket = bucket if bucket is not None else state.profile_bucket
            continue
        for table in _PROFILED:
            conn.execute(f"DELETE FROM {table} WHERE proc = ? AND step = ?", (proc, step))
        state.thinned += 1
    return keep


def _markers(conn: sqlite3.Connection, proc: int, lo: int, hi: int, tables: tuple[str, ...]) -> set[int]:
    found: set[int] = set()
    for table in tables:
        found.update(int(r[0]) for r in conn.execute(
            f"SELECT DISTINCT step FROM {table} WHERE proc = ? AND step BETWEEN ? AND ?", (proc, lo, hi))
            if r[0] is not None)
    return found


def _peaks(rows: list[tuple[Any, ...]], state: FoldState) -> set[int]:
    """Steps that set a new high worth keeping, and the highest step of this fold."""
    out: set[int] = set()
    for i, col in enumerate(_PEAKS, start=3):
        best: int | None = None
        for r in rows:
            v = r[i]
            if v is None or (col in state.highs and v <= state.highs[col]):
                continue
            state.highs[col] = v
            best = r[0]
            last = state.kept_highs.get(col)
            if last is None or v >= last * (1 + PEAK_MARGIN):
                state.kept_highs[col] = v
                out.add(r[0])
        if best is not None:  # the highest so far: it may stay the run's peak
            out.add(best)
            state.kept_highs[col] = state.highs[col]
    return out


def _near(steps: set[int]) -> set[int]:
    return {s + d for s in steps for d in range(-NEAR, NEAR + 1)}


def _windows(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Runs of consecutive steps within one WINDOW_S, as step_windows values (two steps or more)."""
    out: list[tuple[Any, ...]] = []
    run: list[tuple[Any, ...]] = []
    for r in rows:
        if run and (r[0] != run[-1][0] + 1 or r[2] - run[0][1] > WINDOW_S):
            out.extend(_window(run))
            run = []
        run.append(r)
    out.extend(_window(run))
    return out


def _window(run: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    if len(run) < 2:
        return []
    durations = [r[2] - r[1] for r in run]

    def top(i: int) -> tuple[int | None, int | None]:
        vals = [(r[i], r[0]) for r in run if r[i] is not None]
        if not vals:
            return None, None
        best = max(v for v, _ in vals)
        return best, min(s for v, s in vals if v == best)

    def low(i: int) -> tuple[int | None, int | None]:
        vals = [(r[i], r[0]) for r in run if r[i] is not None]
        return min(vals) if vals else (None, None)

    rss, rss_step = top(3)
    alloc, alloc_step = top(4)
    reserved, _ = top(5)
    rss_sum = sum(r[3] for r in run if r[3] is not None) if rss is not None else None
    end_rss, end_rss_step = low(6)
    end_alloc, end_alloc_step = low(7)
    return [(run[0][0], run[-1][0], len(run), run[0][1], run[-1][2], min(durations), max(durations),
             sum(durations), rss, rss_step, rss_sum, alloc, alloc_step, reserved, end_rss,
             end_rss_step, end_alloc, end_alloc_step)]


_INSERT = ("INSERT INTO step_windows (proc, first_step, last_step, steps, start, end, duration_min,"
           " duration_max, duration_sum, peak_rss, peak_rss_step, peak_rss_sum, peak_allocated,"
           " peak_allocated_step, peak_reserved, end_rss, end_rss_step, end_allocated,"
           " end_allocated_step) VALUES (" + ", ".join("?" * 19) + ")")

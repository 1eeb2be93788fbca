"""What the reports need from the ``steps`` table, aggregated in SQL.

A run of a million steps has a million rows: the readers ask SQLite for counts, maxima, the
median and single rows (one pass over the table, then lookups by the primary key), never for
every row as Python objects. :class:`RunReader` checks every column these queries read
(memscope/store/column_guard.py), so a damaged file still fails with one line.

    with RunReader("run.db") as reader:
        stats = step_stats(reader)          # {proc: StepStats}
        stats[1].ok, stats[1].peak("peak_rss")
        median_step_s(reader, 1)            # of the completed steps
        step_at(reader, 1, t)               # the step running at unix time t
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memscope.store.schema import RunFileError

if TYPE_CHECKING:
    from memscope.store.reader import RunReader

PEAK_COLUMNS = ("peak_rss", "peak_allocated")


@dataclass(frozen=True)
class StepStats:
    """One process's steps. ``peaks``: column -> its maximum over the completed steps
    (``ok``) and over those plus the one that failed (``ok_or_failed``)."""

    proc: int
    rows: int               # every step row (any status)
    ok: int                 # completed steps
    last_ok: int | None     # the highest completed step number
    peaks: dict[tuple[str, bool], int | None]

    def peak(self, column: str, with_failed: bool = True) -> int | None:
        return self.peaks[(column, with_failed)]


def scan_source(reader: "RunReader", table: str) -> str:
    """``table`` for a ``FROM`` that reads most of its rows: a run of one process reads them in
    table order (``NOT INDEXED``), three times faster than through the ``(proc, ...)`` index,
    which looks each row up again; with several processes the index skips the others' rows."""
    single = (reader.scalar("SELECT count(*) FROM processes") or 0) <= 1
    return f"{table} NOT INDEXED" if single else table


def step_stats(reader: "RunReader") -> dict[int, StepStats]:
    """Per process, in process order: one pass over the steps table, checked for damage."""
    maxima = []
    for column in PEAK_COLUMNS:
        maxima.append(f"max(CASE WHEN status = 'ok' THEN {column} END)")
        maxima.append(f"max(CASE WHEN status IN ('ok', 'failed') THEN {column} END)")
    sql = (f"SELECT count(*), sum(status = 'ok'), max(CASE WHEN status = 'ok' THEN step END), "
           f"{', '.join(maxima)}, proc FROM {scan_source(reader, 'steps')} GROUP BY proc ORDER BY proc")
    out: dict[int, StepStats] = {}
    for row in reader.rows(sql):
        rows, ok, last_ok, *rest = row
        peak_values, proc = rest[:4], rest[4]
        if proc is None:  # the table says none (a lookup through the index), the scan found one
            raise RunFileError(f"{reader.path}: damaged run file: a steps row has a NULL proc the "
                               "schema forbids (its table and index disagree)")
        peaks = {}
        for i, column in enumerate(PEAK_COLUMNS):
            peaks[(column, False)] = _int(peak_values[2 * i])
            peaks[(column, True)] = _int(peak_values[2 * i + 1])
        out[int(proc)] = StepStats(int(proc), int(rows), int(ok or 0), _int(last_ok), peaks)
    return out


def peak_step(reader: "RunReader", proc: int, column: str, value: int, with_failed: bool = True) -> int | None:
    """The earliest step of ``proc`` whose ``column`` reached ``value`` (the primary key's order:
    the scan stops at the first)."""
    if column not in PEAK_COLUMNS:
        raise ValueError(f"not a peak column: {column}")
    statuses = "('ok', 'failed')" if with_failed else "('ok')"
    row = reader.query(f"SELECT step FROM steps WHERE proc = ? AND status IN {statuses} AND {column} = ?"
                       " ORDER BY step LIMIT 1", (proc, value))
    return int(row[0]["step"]) if row else None


def step_value(reader: "RunReader", proc: int, step: int, column: str) -> int | None:
    """``column`` of one step (a primary-key lookup)."""
    if column not in PEAK_COLUMNS:
        raise ValueError(f"not a peak column: {column}")
    row = reader.query(f"SELECT {column} FROM steps WHERE proc = ? AND step = ?", (proc, step))
    return _int(row[0][column]) if row else None


def median_step_s(reader: "RunReader", proc: int, ok: int) -> float | None:
    """The median duration of ``proc``'s ``ok`` completed steps (``statistics.median``'s: the
    mean of the two middle ones for an even count), sorted by SQLite."""
    if ok <= 0:
        return None
    rows = reader.rows(f"SELECT end - start FROM {scan_source(reader, 'steps')} WHERE proc = ? AND status = 'ok'"
                       " ORDER BY 1 LIMIT ? OFFSET ?", (proc, 2 - ok % 2, (ok - 1) // 2))
    middle = [float(r[0]) for r in rows]
    if not middle:
        return None
    return middle[0] if len(middle) == 1 else (middle[0] + middle[1]) / 2


def step_at(reader: "RunReader", proc: int, t: float, column: str | None = None) -> int | None:
    """The first step (by number) of ``proc`` that was running at unix time ``t``; with
    ``column``, only among steps where it is recorded."""
    where = "" if column is None else f" AND {column} IS NOT NULL"
    if column is not None and column not in PEAK_COLUMNS:
        raise ValueError(f"not a peak column: {column}")
    row = reader.query(f"SELECT step FROM steps WHERE proc = ? AND start <= ? AND end >= ?{where}"
                       " ORDER BY step LIMIT 1", (proc, t, t))
    return int(row[0]["step"]) if row else None


def _int(v: Any) -> int | None:
    return None if v is None else int(v)

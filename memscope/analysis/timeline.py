"""Memory over time, downsampled for display: the timeline the dashboard draws.

Pure functions over a :class:`memscope.store.reader.RunReader`. The downsampling happens in
SQL (each time bucket's maximum, one indexed range query per bucket), so a run with a million
samples costs one pass over the index and returns at most ``buckets`` points per series.

Times are seconds since the run started (``run.started``); sizes are bytes.

    with RunReader("run.db") as reader:
        tl = memory_timeline(reader, buckets=100)
    tl.primary.label               # "host RSS" on a CPU run, "CUDA allocated" on a GPU run
    tl.primary.points[:2]          # [(1.42, 237023232), (1.44, 237219840)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from memscope.store.reader import RunReader

MAX_MARKS = 4000  # step marks a timeline carries at most (two per slice of time beyond that)

# metric id -> human label; the first metric present is the timeline's primary one
METRIC_LABELS: dict[str, str] = {
    "cuda_allocated": "CUDA allocated",
    "cuda_reserved": "CUDA reserved",
    "rss": "host RSS",
}


@dataclass(frozen=True)
class Series:
    """One metric, one point per non-empty time bucket: (seconds since run start, bytes).

    Each point is the bucket's maximum, dated when that maximum was sampled (for a series
    summed over several devices: the latest of the devices' dates within the bucket).
    Points are in increasing time order.
    """

    metric: str
    label: str
    points: list[tuple[float, int]]

    @property
    def min(self) -> int | None:
        return min((v for _, v in self.points), default=None)

    @property
    def max(self) -> int | None:
        return max((v for _, v in self.points), default=None)

    @property
    def last(self) -> int | None:
        return self.points[-1][1] if self.points else None

    def on_grid(self, n: int, t0: float, t1: float) -> list[int]:
        """The series as ``n`` values evenly spaced over [t0, t1], for drawing.

        Each slot holds the largest point falling in it; an empty slot repeats the value
        before it (memory stays where it was last seen), or the first value at the start.
        """
        if not self.points or n <= 0:
            return []
        width = (t1 - t0) / n if t1 > t0 else 1.0
        slots: list[int | None] = [None] * n
        for t, v in self.points:
            i = min(max(int((t - t0) / width), 0), n - 1)
            current = slots[i]
            if current is None or v > current:
                slots[i] = v
        out: list[int] = []
        previous = self.points[0][1]
        for value in slots:
            if value is not None:
                previous = value
            out.append(previous)
        return out


@dataclass(frozen=True)
class StepMark:
    """A step boundary pair, in seconds since the run started (status ``folded``: a window of
    steps a long run folded, ``step`` its last; see memscope/store/fold.py)."""

    step: int
    start: float
    end: float
    status: str


@dataclass(frozen=True)
class Timeline:
    """Memory over time for the run's main process."""

    proc: int | None          # processes.id the series belong to; None for an empty run
    origin: float | None      # unix time of t = 0 (the run's start)
    t0: float                 # first sample, seconds since origin
    t1: float                 # last sample, seconds since origin
    bucket_s: float           # width of one bucket in seconds
    samples: int              # rows of ``samples`` the series were built from
    series: dict[str, Series] = field(default_factory=dict)  # primary metric first
    steps: list[StepMark] = field(default_factory=list)

    @property
    def primary(self) -> Series | None:
        """CUDA allocated bytes when the run used CUDA, else host RSS."""
        return next(iter(self.series.values()), None)

    @property
    def duration(self) -> float:
        return self.t1 - self.t0


@dataclass(frozen=True)
class StepRow:
    """One row of the steps table, with its duration."""

    step: int
    start: float
    end: float
    peak_rss: int | None
    peak_allocated: int | None
    peak_reserved: int | None
    status: str

    @property
    def duration_s(self) -> float:
        return self.end - self.start


def main_process(reader: RunReader) -> int | None:
    """The process a single-process view shows: rank 0 when ranks exist, else the one with
    the most samples (ties: the first registered)."""
    procs = reader.processes()
    if not procs:
        return None
    if len(procs) == 1:
        return int(procs[0]["id"])
    ranked = [p for p in procs if p["rank"] == 0]
    if ranked:
        return int(ranked[0]["id"])
    counts = {r["proc"]: r["n"] for r in
              reader.query("SELECT proc, count(*) AS n FROM samples GROUP BY proc")}
    best = max(procs, key=lambda p: (counts.get(p["id"], 0), -p["id"]))
    return int(best["id"])


def memory_timeline(reader: RunReader, buckets: int = 200, proc: int | None = None,
                    marks: bool = True) -> Timeline:
    """Downsample the main process's memory series to at most ``buckets`` points each.

    Series: ``rss`` (host resident memory, from ``samples``) always; ``cuda_allocated`` and
    ``cuda_reserved`` (summed over devices) when the process has CUDA samples, and then they
    come first. Buckets are equal slices of [first sample, last sample] shared by all series.
    ``marks=False``: without the step marks (:func:`step_marks`), for a caller that draws none.
    """
    if buckets < 1:
        raise ValueError("buckets must be at least 1")
    if proc is None:
        proc = main_process(reader)
    run = reader.run()
    origin: float | None = run["started"] if run else None
    if proc is None:
        return Timeline(None, origin, 0.0, 0.0, 0.0, 0)

    # min and max in separate queries: SQLite answers a lone min() or max() from the index
    host = {"lo": reader.scalar("SELECT min(t) FROM samples WHERE proc = ?", (proc,)),
            "hi": reader.scalar("SELECT max(t) FROM samples WHERE proc = ?", (proc,))}
    dev = reader.query("SELECT min(t) AS lo, max(t) AS hi FROM cuda_samples WHERE proc = ?", (proc,))[0]
    lows = [x for x in (host["lo"], dev["lo"]) if x is not None]
    highs = [x for x in (host["hi"], dev["hi"]) if x is not None]
    steps = step_marks(reader, proc) if marks else []
    if origin is None:
        origin = min(lows) if lows else (steps[0]["start"] if steps else 0.0)
    ticks = [StepMark(int(s["step"]), s["start"] - origin, s["end"] - origin, s["status"])
             for s in steps]
    windows = reader.step_windows(proc) if marks else []
    if windows:  # a long run's folded steps: one mark per window (at most one a second)
        ticks = sorted(ticks + [StepMark(int(w["last_step"]), w["start"] - origin, w["end"] - origin, "folded")
                                for w in windows], key=lambda m: m.step)
    if not lows:
        return Timeline(proc, origin, 0.0, 0.0, 0.0, 0, {}, ticks)

    lo, hi = min(lows), max(highs)
    width = (hi - lo) / buckets if hi > lo else 0.0
    edges = _edges(lo, hi, buckets)

    series: dict[str, Series] = {}
    if dev["lo"] is not None:
        devices = [int(r["device"]) for r in reader.query(
            "SELECT DISTINCT device FROM cuda_samples WHERE proc = ? ORDER BY device", (proc,))]
        for metric, column in (("cuda_allocated", "allocated"), ("cuda_reserved", "reserved")):
            summed: dict[int, tuple[float, int]] = {}
            for device in devices:
                for b, t, v, _ in _bucket_max(reader, "cuda_samples", column,
                                              "proc = ? AND device = ?", (proc, device), edges):
                    t_prev, v_prev = summed.get(b, (t, 0))
                    summed[b] = (max(t, t_prev), v_prev + v)
            series[metric] = Series(metric, METRIC_LABELS[metric],
                                    [(t - origin, v) for _, (t, v) in sorted(summed.items())])

    rows = _bucket_max(reader, "samples", "rss", "proc = ?", (proc,), edges)
    series["rss"] = Series("rss", METRIC_LABELS["rss"], [(t - origin, v) for _, t, v, _ in rows])
    return Timeline(proc, origin, lo - origin, hi - origin, width,
                    sum(n for *_, n in rows), series, ticks)


def step_marks(reader: RunReader, proc: int, limit: int = MAX_MARKS) -> list[dict[str, Any]]:
    """The steps of ``proc`` in step order (step, start, end, status); a run of more than
    ``limit`` steps gets, of the steps ending in each of ``limit // 2`` equal slices of time, the
    first and the last to end. A ruler of up to ``limit // 2`` cells that ticks where steps end
    draws the same ticks from those (a cell no narrower than a slice holds a step's end exactly
    when it holds a slice's first or last), and a million steps stay in SQLite."""
    n = int(reader.scalar("SELECT count(*) FROM steps WHERE proc = ?", (proc,)) or 0)
    if n <= limit:
        return reader.query("SELECT step, start, end, status FROM steps WHERE proc = ? ORDER BY step",
                            (proc,))
    from memscope.store.step_stats import scan_source

    src = scan_source(reader, "steps")
    lo, hi = (reader.query(f"SELECT min(end) AS lo, max(end) AS hi FROM {src} WHERE proc = ?", (proc,))[0][k]
              for k in ("lo", "hi"))
    width = (hi - lo) / (limit // 2) or 1.0
    picked: dict[int, dict[str, Any]] = {}
    for pick in ("min", "max"):  # SQLite's bare columns come from the row holding the min / max
        for r in reader.query(f"SELECT step, start, {pick}(end) AS end, status FROM {src} WHERE proc = ?"
                              " GROUP BY CAST((end - ?) / ? AS INTEGER)", (proc, lo, width)):
            picked[int(r["step"])] = r
    return [picked[k] for k in sorted(picked)]


def _edges(lo: float, hi: float, buckets: int) -> list[tuple[float, float]]:
    """Half-open [a, z) time slices covering [lo, hi]; one slice when lo == hi."""
    if hi <= lo:
        return [(lo, math.nextafter(hi, math.inf))]
    width = (hi - lo) / buckets
    edges = [(lo + b * width, lo + (b + 1) * width) for b in range(buckets)]
    edges[-1] = (edges[-1][0], math.nextafter(hi, math.inf))
    return edges


def _bucket_max(reader: RunReader, table: str, column: str, where: str, params: tuple[Any, ...],
                edges: list[tuple[float, float]]) -> list[tuple[int, float, int, int]]:
    """(bucket, t of the max, max, row count) for each non-empty slice.

    One indexed range query per slice: each reads only its own rows, in index order, with no
    sort. (A single ``GROUP BY`` over a computed bucket sorts every row through a temporary
    B-tree and is about three times slower on a million samples.) SQLite takes the bare
    column ``t`` from the row that holds the single ``max()``.
    """
    sql = (f"SELECT t, max({column}) AS v, count({column}) AS n FROM {table}"
           f" WHERE {where} AND t >= ? AND t < ?")
    out: list[tuple[int, float, int, int]] = []
    for b, (a, z) in enumerate(edges):
        row = reader.query(sql, (*params, a, z))[0]
        if row["v"] is not None:
            out.append((b, float(row["t"]), int(row["v"]), int(row["n"])))
    return out


def recent_steps(reader: RunReader, limit: int = 50, proc: int | None = None) -> list[StepRow]:
    """The last ``limit`` steps of the main process (or ``proc``), most recent first."""
    if proc is None:
        proc = main_process(reader)
    if proc is None:
        return []
    rows = reader.query(
        "SELECT step, start, end, peak_rss, peak_allocated, peak_reserved, status FROM steps"
        " WHERE proc = ? ORDER BY step DESC LIMIT ?", (proc, limit))
    return [StepRow(int(r["step"]), r["start"], r["end"], r["peak_rss"], r["peak_allocated"],
                    r["peak_reserved"], r["status"]) for r in rows]

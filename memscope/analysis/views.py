"""Small reads the dashboard needs that the reports do not: pure functions over a run file.

Nothing here draws; :mod:`memscope_tui` formats what these return. No torch.

    with RunReader("run.db") as reader:
        breakdown_for(reader, proc=1, step=3)    # StepBreakdown(step=3, source_step=1, ...)
        fragmentation(reader, proc=1)           # None on a CPU run
        position(reader, proc=1)                # (12, "backward"): the step being sampled now
        extra_series(reader, timeline, 200)     # [Series("cuda_peak", ...), Series("nvml_used", ...)]
"""

from __future__ import annotations

from dataclasses import dataclass

from memscope.analysis.hotspots import choose_step
from memscope.analysis.timeline import Series, Timeline, _bucket_max, _edges
from memscope.store.reader import RunReader

BREAKDOWN_PARTS = ("parameters", "gradients", "optimizer_state", "activations")


def _has_table(reader: RunReader, name: str) -> bool:
    return bool(reader.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
                              (name,)))


@dataclass(frozen=True)
class StepBreakdown:
    """Where one step's peak went. ``source_step`` is the profiled step the parts were measured
    in (the nearest one to ``step``); ``other`` is the step's peak minus the measured parts."""

    step: int
    source_step: int
    metric: str                    # "cuda_allocated" or "rss": what ``peak_bytes`` measures
    peak_bytes: int | None
    parts: dict[str, int]          # BREAKDOWN_PARTS + "other", bytes


def breakdown_steps(reader: RunReader, proc: int | None) -> list[int]:
    """Steps of ``proc`` with a measured breakdown, in order."""
    if proc is None or not _has_table(reader, "step_breakdown"):
        return []
    return [int(r["step"]) for r in
            reader.query("SELECT step FROM step_breakdown WHERE proc = ? ORDER BY step", (proc,))]


def breakdown_for(reader: RunReader, proc: int | None, step: int) -> StepBreakdown | None:
    """The breakdown of ``step``'s peak, from the profiled step nearest it."""
    source = choose_step(breakdown_steps(reader, proc), step)
    if proc is None or source is None:
        return None
    row = reader.query("SELECT * FROM step_breakdown WHERE proc = ? AND step = ?", (proc, source))[0]
    peak = reader.query("SELECT peak_rss, peak_allocated FROM steps WHERE proc = ? AND step = ?",
                        (proc, step))
    cuda = bool(peak) and peak[0]["peak_allocated"] is not None
    peak_bytes = (peak[0]["peak_allocated"] if cuda else peak[0]["peak_rss"]) if peak else None
    parts = {k: int(row[k] or 0) for k in BREAKDOWN_PARTS}
    parts["other"] = max(0, int(peak_bytes or 0) - sum(parts.values()))
    return StepBreakdown(step, source, "cuda_allocated" if cuda else "rss",
                         int(peak_bytes) if peak_bytes is not None else None, parts)


@dataclass(frozen=True)
class Fragmentation:
    """The CUDA caching allocator when it held the most memory: reserved but unused bytes."""

    t: float                       # seconds since the run started
    reserved: int
    allocated: int
    inactive_split: int | None     # bytes in split blocks not in use (unusable for larger requests)
    alloc_retries: int | None      # cudaMalloc retries after freeing the cache, so far
    ooms: int | None

    @property
    def unused(self) -> int:
        return max(0, self.reserved - self.allocated)

    @property
    def ratio(self) -> float:
        """Share of reserved memory not allocated (0: none wasted)."""
        return self.unused / self.reserved if self.reserved else 0.0


def fragmentation(reader: RunReader, proc: int | None) -> Fragmentation | None:
    """At the sample where reserved memory (summed over devices) was highest; None without CUDA."""
    if proc is None:
        return None
    rows = reader.query(
        "SELECT t, sum(reserved) AS reserved, sum(allocated) AS allocated,"
        " sum(inactive_split) AS inactive_split, max(alloc_retries) AS alloc_retries,"
        " max(ooms) AS ooms FROM cuda_samples WHERE proc = ? GROUP BY t"
        " ORDER BY reserved DESC, t LIMIT 1", (proc,))
    if not rows or rows[0]["reserved"] is None:
        return None
    r = rows[0]
    run = reader.run()
    origin = run["started"] if run else 0.0
    return Fragmentation(float(r["t"]) - origin, int(r["reserved"]), int(r["allocated"] or 0),
                         r["inactive_split"], r["alloc_retries"], r["ooms"])


def extra_series(reader: RunReader, timeline: Timeline, buckets: int) -> list[Series]:
    """The plot's metrics beyond :func:`memory_timeline`'s, on its buckets, where recorded:
    ``cuda_peak`` (the allocator's high-water mark) and ``nvml_used`` (device memory used, as
    NVML sees it: every process and the CUDA context included). Summed over devices; each
    bucket's maximum, like the timeline's own series."""
    out = []
    for table, column, metric, label in (("cuda_samples", "allocated_peak", "cuda_peak", "CUDA peak"),
                                         ("nvml_samples", "used", "nvml_used", "device used (NVML)")):
        series = _summed(reader, timeline, buckets, table, column, metric, label)
        if series is not None:
            out.append(series)
    return out


def device_used(reader: RunReader, timeline: Timeline, buckets: int) -> Series | None:
    """NVML's device-used bytes on the timeline's buckets, or None when NVML did not run."""
    return _summed(reader, timeline, buckets, "nvml_samples", "used", "nvml_used", "device used (NVML)")


def _summed(reader: RunReader, timeline: Timeline, buckets: int, table: str, column: str,
            metric: str, label: str) -> Series | None:
    proc, origin = timeline.proc, timeline.origin
    if proc is None or origin is None or not timeline.series:
        return None
    if not reader.scalar(f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE proc = ?"
                         f" AND {column} IS NOT NULL LIMIT 1)", (proc,)):
        return None
    edges = _edges(timeline.t0 + origin, timeline.t1 + origin, buckets)
    devices = [int(r["device"]) for r in reader.query(
        f"SELECT DISTINCT device FROM {table} WHERE proc = ? ORDER BY device", (proc,))]
    summed: dict[int, tuple[float, int]] = {}
    for device in devices:
        for b, t, v, _ in _bucket_max(reader, table, column, "proc = ? AND device = ?",
                                      (proc, device), edges):
            t_prev, v_prev = summed.get(b, (t, 0))
            summed[b] = (max(t, t_prev), v_prev + v)
    if not summed:
        return None
    return Series(metric, label, [(t - origin, v) for _, (t, v) in sorted(summed.items())])


def position(reader: RunReader, proc: int | None) -> tuple[int | None, str | None]:
    """(step, phase) of the latest sample of ``proc``: where a live run is now."""
    if proc is None:
        return None, None
    rows = reader.query("SELECT step, phase FROM samples WHERE proc = ? ORDER BY t DESC LIMIT 1", (proc,))
    if not rows:
        return None, None
    return int(rows[0]["step"]), rows[0]["phase"]

"""Run-level facts: what ran, how it ended, how many steps, where memory peaked.

Pure functions over rows from :class:`memscope.store.reader.RunReader`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from memscope.analysis.hotspots import Hotspot, breakdown_at, choose_step, hotspots, layer_rows, profiled_steps
from memscope.store.reader import RunReader


@dataclass
class Peak:
    bytes: int | None
    step: int | None
    metric: str  # "cuda_allocated" (allocator bytes in use) or "rss" (host resident memory)
    proc: int | None = None
    breakdown: dict[str, int] | None = None


@dataclass
class RunSummary:
    path: str
    command: list[str]
    status: str
    exit_code: int | None
    signal: int | None
    device: str
    torch: str | None
    steps: int
    samples: int
    dropped: int
    started: float | None
    ended: float | None
    step_mode: str | None
    median_step_s: float | None
    processes: list[dict[str, Any]] = field(default_factory=list)
    peak: Peak = field(default_factory=lambda: Peak(None, None, "rss"))
    hotspots: list[Hotspot] = field(default_factory=list)
    hotspot_step: int | None = None  # the profiled step the hotspots come from
    main_proc: int | None = None  # rank 0, or the process with the most steps


def summarize(reader: RunReader) -> RunSummary:
    run = reader.run() or {"command": [], "status": "unknown", "exit_code": None,
                           "signal": None, "started": None, "ended": None}
    procs = reader.processes()
    steps_by_proc: dict[int, list[dict[str, Any]]] = {}
    for s in reader.steps():
        steps_by_proc.setdefault(s["proc"], []).append(s)
    main = _main_process(procs, steps_by_proc)
    main_steps = steps_by_proc.get(main["id"], []) if main else []
    durations = [s["end"] - s["start"] for s in main_steps if s["status"] == "ok"]
    peak = find_peak(reader, procs, steps_by_proc)
    spots: list[Hotspot] = []
    spot_step = None
    if main is not None:
        layer_steps = [st for _, st in profiled_steps(reader, main["id"])]
        spot_step = choose_step(layer_steps, peak.step if peak.proc in (None, main["id"]) else None)
        if spot_step is not None:
            spots = [h for h in hotspots(layer_rows(reader, main["id"], spot_step))
                     if h.activation_bytes > 0]
        peak.breakdown = breakdown_at(reader, peak.proc if peak.proc is not None else main["id"],
                                      peak.step, peak.bytes)
    return RunSummary(
        path=reader.path,
        command=run["command"],
        status=run["status"],
        exit_code=run["exit_code"],
        signal=run["signal"],
        device=_device(procs),
        torch=main["torch"] if main else None,
        steps=sum(1 for s in main_steps if s["status"] == "ok"),
        samples=reader.sample_count(),
        dropped=sum(p["dropped"] or 0 for p in procs),
        started=run["started"],
        ended=run["ended"],
        step_mode=main["step_mode"] if main else None,
        median_step_s=statistics.median(durations) if durations else None,
        processes=procs,
        peak=peak,
        hotspots=spots,
        hotspot_step=spot_step,
        main_proc=main["id"] if main else None,
    )


def _main_process(procs: list[dict[str, Any]],
                  steps_by_proc: dict[int, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """Rank 0 when ranks exist, else the process that recorded the most steps."""
    if not procs:
        return None
    ranked = [p for p in procs if p["rank"] == 0]
    if ranked:
        return ranked[0]
    return max(procs, key=lambda p: (len(steps_by_proc.get(p["id"], [])), -p["id"]))


def _device(procs: list[dict[str, Any]]) -> str:
    devices = sorted({p["device"] or "cpu" for p in procs})
    if not devices:
        return "cpu"
    if len(devices) == 1:
        return devices[0]
    cuda = [d for d in devices if d.startswith("cuda")]
    return "cuda" if cuda else devices[0]


def find_peak(reader: RunReader, procs: list[dict[str, Any]],
              steps_by_proc: dict[int, list[dict[str, Any]]]) -> Peak:
    """The run's peak: allocator bytes on CUDA, resident host memory on CPU.

    The allocator's own high-water mark (``allocated_bytes.all.peak``) and the process's peak
    RSS are exact; per-step peaks place it in a step. A peak outside every step (loading data
    before the first step, say) has ``step = None``.
    """
    if reader.scalar("SELECT count(*) FROM cuda_samples"):
        return _peak_cuda(reader, steps_by_proc)
    best: Peak = Peak(None, None, "rss")
    for p in procs:
        row = reader.query("SELECT t, step, rss FROM samples WHERE proc = ? ORDER BY rss DESC, t LIMIT 1",
                           (p["id"],))
        steps = [s for s in steps_by_proc.get(p["id"], []) if s["peak_rss"] is not None]
        top_step = max(steps, key=lambda s: s["peak_rss"], default=None)
        candidates: list[tuple[int, int | None]] = []
        if row:
            candidates.append((row[0]["rss"], _step_at(steps, row[0]["t"])))
        if top_step is not None:
            candidates.append((top_step["peak_rss"], top_step["step"]))
        if not candidates:
            continue
        value, step = max(candidates, key=lambda c: c[0])
        if best.bytes is None or value > best.bytes:
            best = Peak(value, step, "rss", p["id"])
    return best


def _peak_cuda(reader: RunReader, steps_by_proc: dict[int, list[dict[str, Any]]]) -> Peak:
    best = Peak(None, None, "cuda_allocated")
    rows = reader.query(
        "SELECT proc, max(allocated_peak) AS hwm FROM cuda_samples GROUP BY proc")
    for r in rows:
        if r["hwm"] is None:
            continue
        steps = [s for s in steps_by_proc.get(r["proc"], []) if s["peak_allocated"] is not None]
        # the first sample that saw the final high-water mark dates it
        first = reader.query(
            "SELECT min(t) AS t FROM cuda_samples WHERE proc = ? AND allocated_peak >= ?",
            (r["proc"], r["hwm"]))
        step = _step_at(steps, first[0]["t"]) if first and first[0]["t"] is not None else None
        if best.bytes is None or r["hwm"] > best.bytes:
            best = Peak(int(r["hwm"]), step, "cuda_allocated", r["proc"])
    return best


def _step_at(steps: list[dict[str, Any]], t: float) -> int | None:
    for s in steps:
        if s["start"] <= t <= s["end"]:
            return int(s["step"])
    return None

"""Run-level facts: what ran, how it ended, how many steps, where memory peaked.

Pure functions over rows from :class:`memscope.store.reader.RunReader`.
"""

from __future__ import annotations

import json

from dataclasses import dataclass, field
from typing import Any

from memscope.analysis.oom import OomReport, post_mortem
from memscope.analysis.hooks import HookGrowth, hook_growth
from memscope.analysis.leaks import (MIN_INVENTORIES, Leak, LeakCheck, has_inventories, inventory_steps, leak_check,
                                     leaks_of)
from memscope.analysis.unexplained import UnexplainedGrowth, unexplained_growth
from memscope.analysis.workers import WorkerGrowth, worker_growth
from memscope.analysis.ranks import RankSummary, rank_summaries
from memscope.analysis.hotspots import (
    Hotspot,
    breakdown_at,
    choose_step,
    closure_forwards,
    hotspots,
    layer_rows,
    micro_batches,
    profiled_steps,
)
from memscope.analysis.attached import Attached, attached_of
from memscope.store.reader import RunReader
from memscope.store.step_stats import (StepStats, peak_step, scan_source, step_at, step_stats,
                                       step_value)
from memscope.units import human_bytes

# how close to the highest step's peak the step that ran out of memory must be to count as the
# peak (a fraction): the peak RSS of two steps of one steady loop differs by up to 2% (a loop
# failing in step 2's optimizer, 8 runs side by side: step 1 357-363 MiB, step 2 360-368 MiB; a
# full test run once had step 1 over 1% above step 2, and called step 1 the peak)
OOM_PEAK_TIE = 0.05


@dataclass
class Peak:
    bytes: int | None
    step: int | None
    metric: str  # "cuda_allocated" (allocator bytes in use) or "rss" (host resident memory)
    proc: int | None = None
    breakdown: dict[str, int] | None = None
    whole_run_bytes: int | None = None  # highest reading anywhere in the run, steps or not
    breakdown_step: int | None = None  # the step the breakdown was measured in
    breakdown_at_failure: bool = False  # measured at the OOM itself (the failing step's peak)


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
    # micro-batches in that step (the hotspots are per micro-batch); None: a file before schema 7
    hotspot_micro_batches: int | None = None
    # of those, forwards inside optimizer.step(): a closure the optimizer evaluates (LBFGS)
    hotspot_closure_forwards: int = 0
    main_proc: int | None = None  # rank 0, or the process with the most steps
    leaks: list[Leak] = field(default_factory=list)  # steadily growing tensor groups (main process)
    leak_check: LeakCheck = field(default_factory=lambda: LeakCheck(0, MIN_INVENTORIES))  # enough inventories?
    unexplained: UnexplainedGrowth | None = None  # memory growth no tensor group accounts for
    hooks: list[HookGrowth] = field(default_factory=list)  # hooks registered again and again
    workers: WorkerGrowth | None = None  # DataLoader workers' copy-on-read growth
    oom: OomReport | None = None  # the out-of-memory post-mortem (or the killing signal)
    cut_short: str | None = None  # why the run was ended on purpose (--max-steps), if it was
    # techniques memscope applied to the unchanged script (attach --try, whatif trials): what
    # the numbers are of; each {"technique", "applied", "message"}
    techniques: list[dict[str, Any]] = field(default_factory=list)
    ranks: list[RankSummary] = field(default_factory=list)  # one per process (memscope.analysis.ranks)
    # why the record is incomplete, where it is: recording degraded (the writer's error and from
    # when), the supervisor died, the end was never written, a -wal file holding part of the run
    recording: list[str] = field(default_factory=list)
    # a measurement the agent took over less than a whole step, or not at all, and why (one line
    # each: memscope.agent.collectors.measure_budget, peak_step)
    measured: list[str] = field(default_factory=list)
    # attached to a running process (memscope attach --pid): when it started, when memscope came
    # and went; None for a run memscope launched
    attached: Attached | None = None


def _leaked_at_peak(reader: RunReader, peak: Peak, leaks: list[Leak], proc: int) -> None:
    """``peak.breakdown["leaked"]``: what the leaking groups held (tensors, what their graphs
    saved, their nodes) at the inventory nearest the peak step, taken out of ``other``, where
    they were (a profiled step's categories are its own parameters, state and saved
    activations; kept tensors of older steps are none of them). 0 without leaks."""
    bd = peak.breakdown
    if bd is None:
        return
    held = 0
    if leaks and peak.step is not None and has_inventories(reader):
        near = reader.scalar("SELECT step FROM inventories WHERE proc = ? ORDER BY abs(step - ?), step LIMIT 1",
                             (proc, peak.step))
        rows = reader.query("SELECT * FROM inventory_groups WHERE proc = ? AND step = ?", (proc, near)) \
            if near is not None else []
        keys = {(lk.category, lk.dtype, json.dumps(lk.shape) if lk.shape is not None else None, lk.grad_fn)
                for lk in leaks}
        each = leaks[0].node_cost.bytes
        for r in rows:
            if (r["category"], r["dtype"], r["shape"], r["grad_fn"]) in keys:
                held += int(r.get("bytes") or 0) + int(r.get("graph_bytes") or 0) \
                    + int(r.get("graph_nodes") or 0) * each  # (files before schema 5 have no nodes)
    other = int(bd.get("other") or 0)
    leaked = min(held, other)
    out = {k: v for k, v in bd.items() if k != "other"}
    out["leaked"] = leaked
    out["other"] = other - leaked
    peak.breakdown = out


def _causes(leaks: list[Leak], hooks: list[HookGrowth]) -> None:
    """An accelerating leak beside hooks that keep coming: those hooks are the likely cause (each
    one added runs, and keeps, at every call from then on)."""
    if not hooks:
        return
    h = hooks[0]
    at = f", registered at {h.site}" if h.site else ""
    for lk in leaks:
        if lk.accelerating:
            lk.cause = (f"{h.what} grow by {h.per_step:g} a step ({h.count} now{at}), and each "
                        "runs at every call from then on")


@dataclass
class _Basics:
    run: dict[str, Any]
    procs: list[dict[str, Any]]
    stats: dict[int, StepStats]
    folded: dict[int, int]
    main: dict[str, Any] | None
    oom: OomReport | None
    peak: Peak

    @property
    def steps(self) -> int:
        if self.main is None:
            return 0
        main_stats = self.stats.get(self.main["id"])
        return (main_stats.ok if main_stats else 0) + self.folded.get(self.main["id"], 0)

    @property
    def dropped(self) -> int:
        return sum(p["dropped"] or 0 for p in self.procs)


def _basics(reader: RunReader) -> _Basics:
    run = reader.run() or {"command": [], "status": "unknown", "exit_code": None,
                           "signal": None, "started": None, "ended": None}
    procs = reader.processes()
    stats = step_stats(reader)  # one pass over the steps table, whatever its length
    folded = reader.folded_steps()  # steps a long run's writer folded into windows
    main = _main_process(procs, stats, folded)
    oom = post_mortem(reader)
    return _Basics(run, procs, stats, folded, main, oom, find_peak(reader, procs, stats, _oom_step(oom, main)))


@dataclass
class Headline:
    """The figures of the line ``attach`` prints as a run ends."""
    path: str
    steps: int
    status: str
    peak: Peak
    dropped: int
    recording: list[str]


def headline(reader: RunReader) -> Headline:
    """What :func:`summarize` says of steps, peak, status and losses, without the analyses the
    closing line does not show: the leak analysis alone is most of a summary's time (about 20 ms
    at 3,000 steps, more on a long run), spent while the user waits for the exit status."""
    b = _basics(reader)
    return Headline(path=reader.path, steps=b.steps, status=b.run["status"], peak=b.peak,
                    dropped=b.dropped, recording=recording_notes(reader, b.run))


def summarize(reader: RunReader) -> RunSummary:
    b = _basics(reader)
    run, procs, stats, main, oom, peak = b.run, b.procs, b.stats, b.main, b.oom, b.peak
    spots: list[Hotspot] = []
    spot_step = None
    spot_micro = None
    spot_closure = 0
    if main is not None:
        layer_steps = [st for _, st in profiled_steps(reader, main["id"])]
        spot_step = choose_step(layer_steps, peak.step if peak.proc in (None, main["id"]) else None)
        if spot_step is not None:
            spot_rows = layer_rows(reader, main["id"], spot_step)
            spots = [h for h in hotspots(spot_rows) if h.activation_bytes > 0]
            spot_micro = micro_batches(spot_rows)
            spot_closure = closure_forwards(reader, main["id"], spot_step)
        peak.breakdown = breakdown_at(reader, peak.proc if peak.proc is not None else main["id"],
                                      peak.step, peak.bytes)
        peak.breakdown_step = _breakdown_step(reader, peak.proc if peak.proc is not None else main["id"],
                                              peak.step) if peak.breakdown else None
    if main is not None:
        _breakdown_at_failure(peak, oom, main["id"])
    leaks = leaks_of(reader, main["id"] if main else None)
    hooks = hook_growth(reader, main["id"] if main else None,
                        inventory_steps(reader, main["id"]) if main else [])
    _causes(leaks, hooks)
    if main is not None and peak.breakdown is not None:
        _leaked_at_peak(reader, peak, leaks, peak.proc if peak.proc is not None else main["id"])
    ranks = rank_summaries(reader, stats)
    median = next((r.median_step_s for r in ranks if main and r.proc == main["id"]), None)
    return RunSummary(
        path=reader.path,
        command=run["command"],
        status=run["status"],
        exit_code=run["exit_code"],
        signal=run["signal"],
        device=_device(procs),
        torch=main["torch"] if main else None,
        steps=b.steps,
        samples=reader.sample_count(),
        dropped=b.dropped,
        started=run["started"],
        ended=run["ended"],
        step_mode=main["step_mode"] if main else None,
        median_step_s=median,
        processes=procs,
        peak=peak,
        hotspots=spots,
        hotspot_step=spot_step,
        hotspot_micro_batches=spot_micro,
        hotspot_closure_forwards=spot_closure,
        main_proc=main["id"] if main else None,
        leaks=leaks,
        leak_check=leak_check(reader, main["id"] if main else None),
        unexplained=unexplained_growth(reader, main["id"] if main else None, leaks),
        hooks=hooks,
        workers=worker_growth(reader),
        oom=oom,
        cut_short=next((e["message"] for e in reader.events("max_steps")), None),
        techniques=_techniques(reader),
        ranks=ranks,
        recording=recording_notes(reader, run),
        measured=[str(e["message"]) for e in reader.events() if e["kind"] in _MEASURED_EVENTS and e["message"]],
        attached=attached_of(reader, main),
    )


def _breakdown_step(reader: RunReader, proc: int | None, near: int | None) -> int | None:
    """The profiled step :func:`breakdown_at` took the breakdown from."""
    rows = reader.query("SELECT DISTINCT step FROM step_breakdown WHERE proc = ? ORDER BY step", (proc,))
    return choose_step([int(r["step"]) for r in rows], near)


def _breakdown_at_failure(peak: Peak, oom: OomReport | None, main: int) -> None:
    """When the peak is the step that ran out of memory, its breakdown is what the OOM census
    found live at the failure (``other``: the peak minus the four categories, as for a profiled
    step), not a profiled step's."""
    if oom is None or oom.kind != "oom" or not oom.breakdown_at_failure or peak.bytes is None:
        return
    if oom.step is None or oom.step != peak.step or (oom.proc is not None and oom.proc != (peak.proc or main)):
        return
    bd = oom.breakdown or {}
    parts = {k: int(bd.get(k) or 0) for k in ("parameters", "gradients", "optimizer_state", "activations")}
    parts["other"] = max(0, peak.bytes - sum(parts.values()))
    peak.breakdown = parts
    peak.breakdown_step = oom.step
    peak.breakdown_at_failure = True


_RECORDING_EVENTS = ("recording_degraded", "recording_recovered", "recording_incomplete",
                     "supervisor_gone", "agent_missing", "agent_failed")


_MEASURED_EVENTS = ("measure_bounded", "tensor_peak_skipped")


def recording_notes(reader: RunReader, run: dict[str, Any]) -> list[str]:
    """One line per thing that makes this record incomplete (empty for a clean run)."""
    notes = [str(e["message"]).removeprefix("recording ") for e in reader.events()
             if e["kind"] in _RECORDING_EVENTS and e["message"]]
    if run.get("status") == "abandoned":
        notes.append("abandoned: the run says running, but no process is left writing it "
                     "(its supervisor and training were killed, or the end could not be written)")
    wal = reader.wal_pending()
    if wal and run.get("status") != "running":  # a live run's -wal is the writer's business
        notes.append(f"{reader.path}-wal ({human_bytes(wal)}) belongs to this run file: copy or move "
                     "both together")
    return notes


def _techniques(reader: RunReader) -> list[dict[str, Any]]:
    out = []
    for e in reader.events("technique"):
        data = e["data"] if isinstance(e["data"], dict) else {}
        out.append({"technique": data.get("technique"), "applied": bool(data.get("applied")),
                    "message": e["message"]})
    return out


def _main_process(procs: list[dict[str, Any]], stats: dict[int, StepStats],
                  folded: dict[int, int] | None = None) -> dict[str, Any] | None:
    """Rank 0 when ranks exist, else the process that recorded the most steps."""
    if not procs:
        return None
    ranked = [p for p in procs if p["rank"] == 0]
    if ranked:
        return ranked[0]
    folded = folded or {}
    return max(procs, key=lambda p: ((stats[p["id"]].rows if p["id"] in stats else 0) + folded.get(p["id"], 0),
                                      -p["id"]))


def _device(procs: list[dict[str, Any]]) -> str:
    devices = sorted({p["device"] or "cpu" for p in procs})
    if not devices:
        return "cpu"
    if len(devices) == 1:
        return devices[0]
    cuda = [d for d in devices if d.startswith("cuda")]
    return "cuda" if cuda else devices[0]


def _oom_step(oom: OomReport | None, main: dict[str, Any] | None) -> tuple[int, int] | None:
    """(process, step) of the step that ran out of memory, when the run had an allocator error."""
    if oom is None or oom.kind != "oom" or oom.step is None:
        return None
    proc = oom.proc if oom.proc is not None else (main["id"] if main else None)
    return None if proc is None else (proc, oom.step)


def find_peak(reader: RunReader, procs: list[dict[str, Any]], stats: dict[int, StepStats],
              oom_step: tuple[int, int] | None = None) -> Peak:
    """The training peak: allocator bytes on CUDA, resident host memory on CPU.

    It is the largest per-step peak (the earliest step on a tie), so it always names a step
    when the run completed one. Host RSS rarely falls (freed memory stays with the process), so
    the highest reading is often taken after the last step; that whole-run figure is kept in
    ``whole_run_bytes``. Without completed steps the whole-run peak is the peak, ``step = None``.

    ``oom_step`` (process, step) is the step that ran out of memory: it is the peak when its
    reading is within :data:`OOM_PEAK_TIE` of the highest, since it held that much and then asked
    for more than there was (its demand was the run's highest); sampled host RSS cannot tell
    steps that close apart, and which step failed is what the user needs the breakdown of.
    """
    cuda = bool(reader.scalar("SELECT count(*) FROM (SELECT 1 FROM cuda_samples LIMIT 1)"))
    whole = _peak_cuda(reader) if cuda else _peak_rss_samples(reader, procs)
    column = "peak_allocated" if cuda else "peak_rss"
    best: Peak | None = None
    for proc, st in stats.items():  # in process order: the first process wins a tie
        # the failing step (an OOM) is a step: its peak is the run's when it is the highest
        value = st.peak(column, with_failed=True)
        if value is not None and (best is None or value > (best.bytes or 0)):
            best = Peak(value, peak_step(reader, proc, column, value), whole.metric, proc)
    if best is None:
        return whole
    failed = step_value(reader, *oom_step, column) if oom_step is not None else None
    if failed is not None and failed >= (best.bytes or 0) * (1 - OOM_PEAK_TIE) and oom_step is not None:
        best = Peak(failed, oom_step[1], whole.metric, oom_step[0])
    best.whole_run_bytes = max(whole.bytes or 0, best.bytes or 0)
    return best


def _peak_rss_samples(reader: RunReader, procs: list[dict[str, Any]]) -> Peak:
    """The highest RSS sample of the run, dated to a step when it fell inside one."""
    best: Peak = Peak(None, None, "rss")
    for p in procs:
        # SQLite's bare-column max(): t comes from the row holding the max; one pass, no sort
        row = reader.query(f"SELECT t, max(rss) AS rss FROM {scan_source(reader, 'samples')} WHERE proc = ?",
                           (p["id"],))
        if row and row[0]["rss"] is not None and (best.bytes is None or row[0]["rss"] > best.bytes):
            best = Peak(int(row[0]["rss"]), step_at(reader, p["id"], row[0]["t"]), "rss", p["id"])
    best.whole_run_bytes = best.bytes
    return best


def _peak_cuda(reader: RunReader) -> Peak:
    best = Peak(None, None, "cuda_allocated")
    rows = reader.query(
        "SELECT proc, max(allocated_peak) AS hwm FROM cuda_samples GROUP BY proc")
    for r in rows:
        if r["hwm"] is None:
            continue
        # the first sample that saw the final high-water mark dates it
        first = reader.query(
            "SELECT min(t) AS t FROM cuda_samples WHERE proc = ? AND allocated_peak >= ?",
            (r["proc"], r["hwm"]))
        step = (step_at(reader, r["proc"], first[0]["t"], "peak_allocated")
                if first and first[0]["t"] is not None else None)
        if best.bytes is None or r["hwm"] > best.bytes:
            best = Peak(int(r["hwm"]), step, "cuda_allocated", r["proc"])
    best.whole_run_bytes = best.bytes
    return best

"""Reading a run file for the dashboard: memscope.store + memscope.analysis calls only.

:func:`load_snapshot` runs on a worker thread; it returns a frozen :class:`Snapshot` of plain
dataclasses that the views only format. It reads everything (seconds at a million steps), so the
app first draws a :class:`HeadSource`'s partial snapshot (the run, its peak, a downsampled
timeline, the last steps: one SQL pass at the first read, then only the rows appended since,
through a :class:`~memscope.analysis.run_head.RunHead`) and, while the run is live, lays each
later head over the last full snapshot (:func:`with_head`). What the user picked (profiled step,
fold depth, the two inventories to compare, the breakdown step) travels in a :class:`Selection`."""

from __future__ import annotations

import concurrent.futures
import os
import time
from dataclasses import dataclass, replace
from typing import Any

from memscope.analysis.hotspots import (
    Hotspot,
    choose_step,
    closure_forwards,
    hotspots,
    layer_rows,
    micro_batches,
    profiled_steps,
)
from memscope.analysis.categories import CategoryTimeline, LeakGrowth, category_timeline, leak_growth
from memscope.analysis.leaks import GroupDiff, diff, inventory_steps
from memscope.analysis.oom import advice
from memscope.analysis.ranks import RankSummary
from memscope.analysis.ranks import imbalance as rank_imbalance
from memscope.analysis.run_head import RunHead
from memscope.analysis.run_timeline import Mark, marks
from memscope.analysis.suggestions import suggest
from memscope.analysis.summary import RunSummary, summarize
from memscope.analysis.timeline import (Series, StepMark, StepRow, Timeline, memory_timeline,
                                       recent_steps)
from memscope.analysis.views import (Fragmentation, StepBreakdown, breakdown_for, breakdown_steps,
                                     extra_series, fragmentation, position)
from memscope.store.reader import RunReader

BUCKETS = 200       # timeline resolution read from the run file (the plot re-buckets to its width)
TABLE_STEPS = 50    # steps shown in the overview table, most recent first
CATEGORY_POINTS = 200  # inventories read for the category and leak plots (more than a plot has columns)


@dataclass(frozen=True)
class Selection:
    """What the user chose in the views; None means the default."""

    layer_step: int | None = None      # profiled step of the layer table (default: nearest the peak)
    depth: int | None = None           # fold module names to this many dotted parts (None: no folding)
    diff_from: int | None = None       # inventories compared in the leaks view (default: first, last)
    diff_to: int | None = None
    breakdown_step: int | None = None  # step of the breakdown's second column (default: the last)


@dataclass(frozen=True)
class Part:
    """An analysis result, or why it failed: one failing analysis must not blank the dashboard."""

    value: Any = None
    error: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything the views show, read in one go off the UI thread."""

    summary: RunSummary
    timeline: Timeline
    extra_series: list[Series]                      # CUDA peak, NVML device used, where recorded
    steps: list[StepRow]
    position: tuple[int | None, str | None]          # (step, phase) of the latest sample
    layer_steps: list[int]
    layer_step: int | None
    depth: int | None
    max_depth: int
    layers: list[Hotspot]
    layer_micro_batches: int | None                  # the layer step's micro-batches (rows: one each)
    layer_closure_forwards: int                      # of those, an optimizer's closure evaluations
    inventory_steps: list[int]
    diff_from: int | None
    diff_to: int | None
    diff: list[GroupDiff]
    breakdown_steps: list[int]                       # steps that completed (choices)
    breakdown: StepBreakdown | None
    fragmentation: Fragmentation | None
    oom_advice: list[str]
    suggestions: Part
    ranks: list[RankSummary]                         # one per process (from the summary)
    imbalance: float | None
    read_s: float                                    # how long the read took
    partial: bool = False                            # only the head: the analyses are still loading
    rows_read: int = 0                               # a head read: sample and step rows it covered
    cpu_s: float = 0.0                               # a head read: CPU seconds of its thread
    categories: CategoryTimeline | None = None       # memory by category over the steps (full read)
    leak_growth: tuple[LeakGrowth, ...] = ()         # each leak's group over the steps, with its rate
    marks: tuple[Mark, ...] = ()                     # the peak step, OOMs, evaluations, attach/detach
    inputs: tuple[Any, ...] = ()                     # a head read: what the analyses read (changed: re-read);
                                                     # a new peak too (its breakdown)

# tables the slow analyses (leaks, layers, breakdown, suggestions, OOM) read beyond the head's
_INPUTS = ("events", "layer_stats", "step_breakdown", "inventories", "leak_holders")


class HeadSource:
    """The head reads of one dashboard (:meth:`read`, on worker threads, one at a time). The
    file stays open between them: opening a run file checks it (a pass over its steps table, 5 ms
    at a million steps). A path that names another file now (replaced, moved) is opened anew
    and read from the start."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.head = RunHead()
        self._reader: RunReader | None = None
        self._file: tuple[int, int] | None = None

    def read(self) -> Snapshot:
        """The overview's data only (``partial``): run facts, the peak, the timeline, the last
        steps; after the first read, from the rows appended since."""
        began, cpu = time.perf_counter(), time.thread_time()
        reader = self._open()
        try:
            h = self.head.read(reader)
            have = {r["name"] for r in reader.query("SELECT name FROM sqlite_master WHERE type = 'table'")}
            inputs = tuple(reader.scalar(f"SELECT max(rowid) FROM {t}") if t in have else None for t in _INPUTS)
        except Exception:
            self.close()  # a failed read starts over on a fresh connection
            raise
        s = h.summary
        return Snapshot(
            summary=s, timeline=h.timeline, extra_series=[], steps=h.steps, position=h.position,
            layer_steps=[], layer_step=None, depth=None, max_depth=0, layers=[], layer_micro_batches=None,
            layer_closure_forwards=0, inventory_steps=[], diff_from=None, diff_to=None, diff=[],
            breakdown_steps=[], breakdown=None, fragmentation=None, oom_advice=[], suggestions=Part(),
            ranks=[], imbalance=None, read_s=time.perf_counter() - began, partial=True,
            rows_read=h.rows_read, inputs=(s.status, s.peak.bytes, s.peak.step, *inputs),
            cpu_s=time.thread_time() - cpu)

    def _open(self) -> RunReader:
        st = os.stat(self.db)
        file = (st.st_dev, st.st_ino)
        if self._reader is not None and file != self._file:
            self.close()
            self.head = RunHead()
        if self._reader is None:
            self._reader = RunReader(self.db, threads=True)
            self._file = file
        return self._reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def load_head(db: str, head: RunHead) -> Snapshot:
    """One head read of ``db`` (a :class:`HeadSource` keeps the file open between reads)."""
    source = HeadSource(db)
    source.head = head
    try:
        return source.read()
    finally:
        source.close()


# RunSummary fields a head read has fresh; the rest (leaks, hotspots, ranks...) come from the full read
_HEAD_FIELDS = ("command", "status", "exit_code", "signal", "device", "torch", "steps", "samples",
                "dropped", "started", "ended", "step_mode", "processes", "main_proc", "oom")


def with_head(full: Snapshot, head: Snapshot) -> Snapshot:
    """The last full snapshot with a newer head's overview laid over it (a live refresh)."""
    s = full.summary
    peak = head.summary.peak
    if (peak.bytes, peak.step, peak.proc) == (s.peak.bytes, s.peak.step, s.peak.proc):
        peak = s.peak  # unchanged: keep its breakdown and whole-run reading
    summary = replace(s, peak=peak, **{k: getattr(head.summary, k) for k in _HEAD_FIELDS})
    # the ruler's step marks: the full read's, then the head's last steps that ended since
    marks = list(full.timeline.steps)
    origin = head.timeline.origin
    if origin is not None:
        after = marks[-1].step if marks else -1
        marks += [StepMark(r.step, r.start - origin, r.end - origin, r.status)
                  for r in reversed(head.steps) if r.step > after]
    timeline = replace(head.timeline, steps=marks)
    return replace(full, summary=summary, timeline=timeline, steps=head.steps,
                   position=head.position, read_s=head.read_s, rows_read=head.rows_read, cpu_s=head.cpu_s,
                   oom_advice=advice(summary.oom) if summary.oom is not None else [])


def load_snapshot(db: str, sel: Selection = Selection(), buckets: int = BUCKETS,
                  steps: int = TABLE_STEPS) -> Snapshot:
    began = time.perf_counter()
    # The timeline and the summary each scan every sample once; sqlite3 lets go of the GIL while
    # it runs a query, so on two connections the two scans overlap (a 1M-sample run opens in
    # about the time of the longer one).
    plot: concurrent.futures.Future[tuple[Timeline, list[Series]]]
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="memscope-timeline") as pool:
        plot = pool.submit(_read_timeline, db, buckets)
        with RunReader(db) as reader:
            summary = summarize(reader)
            snap = _rest(reader, summary, sel, steps)
        timeline, extra = plot.result()
    return replace(snap, timeline=timeline, extra_series=extra, read_s=time.perf_counter() - began)


def _read_timeline(db: str, buckets: int) -> tuple[Timeline, list[Series]]:
    with RunReader(db) as reader:
        timeline = memory_timeline(reader, buckets)
        return timeline, extra_series(reader, timeline, buckets)


def _rest(reader: RunReader, summary: RunSummary, sel: Selection, steps: int) -> Snapshot:
    """Everything but the timeline: small reads (one step's layers, two inventories...)."""
    proc = summary.main_proc
    rows = recent_steps(reader, steps, proc=proc)

    layer_steps = [s for _, s in profiled_steps(reader, proc)] if proc is not None else []
    layer_step = sel.layer_step if sel.layer_step in layer_steps else summary.hotspot_step
    if layer_step not in layer_steps:
        layer_step = choose_step(layer_steps, summary.peak.step)
    raw = layer_rows(reader, proc, layer_step) if proc is not None and layer_step is not None else []
    max_depth = max((len(r["module"].split(".")) for r in raw if r["module"]), default=0)
    depth = sel.depth if sel.depth is not None and 0 < sel.depth < max_depth else None
    layers = hotspots(raw, depth)  # '' is the whole model: shown as (model) TYPE
    micro = micro_batches(raw)
    closure = closure_forwards(reader, proc, layer_step) if proc is not None else 0

    inv = inventory_steps(reader, proc) if proc is not None else []
    a = sel.diff_from if sel.diff_from in inv else (inv[0] if inv else None)
    b = sel.diff_to if sel.diff_to in inv else (inv[-1] if inv else None)
    groups = diff(reader, proc, a, b) if proc is not None and a is not None and b is not None else []

    done = [r.step for r in reversed(rows) if r.status == "ok"]
    bstep = sel.breakdown_step if sel.breakdown_step in done else (done[-1] if done else None)
    bd = breakdown_for(reader, proc, bstep) if bstep is not None and breakdown_steps(reader, proc) else None

    suggestions = _guarded(suggest, reader, summary)
    cats = _guarded(category_timeline, reader, proc, summary.leaks, CATEGORY_POINTS).value
    growth = _guarded(leak_growth, reader, proc, summary.leaks, CATEGORY_POINTS).value or []
    run = reader.run()
    moments = _guarded(marks, reader, proc, summary.peak.step, run["started"] if run else None).value or []

    return Snapshot(
        summary=summary, timeline=Timeline(proc, None, 0.0, 0.0, 0.0, 0), extra_series=[],
        steps=rows, position=position(reader, proc),
        layer_steps=layer_steps, layer_step=layer_step, depth=depth, max_depth=max_depth,
        layers=layers, layer_micro_batches=micro, layer_closure_forwards=closure,
        inventory_steps=inv, diff_from=a, diff_to=b, diff=groups,
        breakdown_steps=done, breakdown=bd, fragmentation=fragmentation(reader, proc),
        oom_advice=advice(summary.oom) if summary.oom is not None else [],
        suggestions=suggestions, ranks=summary.ranks, imbalance=rank_imbalance(summary.ranks),
        read_s=0.0, categories=cats, leak_growth=tuple(growth), marks=tuple(moments))


def _guarded(fn: Any, *args: Any) -> Part:
    try:
        return Part(fn(*args))
    except Exception as exc:  # noqa: BLE001 - one failing analysis must not blank the dashboard
        return Part(None, f"{type(exc).__name__}: {exc}")

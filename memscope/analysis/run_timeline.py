"""The one timeline model the dashboard, the HTML page and notebooks draw: memory over time (the
process metrics), memory by category over the steps, each leaking group's growth with the
verdict's rate, and the moments worth marking (the peak step, out-of-memory errors, evaluations,
attach and detach). Each part is downsampled in SQL (:mod:`memscope.analysis.timeline`,
:mod:`memscope.analysis.categories`): a run of a million steps draws as fast as a short one.

    with RunReader("run.db") as reader:
        tl = run_timeline(reader, summarize(reader))
    tl.memory.primary.label      # "host RSS"
    tl.categories.stack          # ["parameters", "gradients", "optimizer_state", "activations", "leak:0"]
    tl.leaks[0].fit              # ((2, 1188888.0), (14, 5944440.0)): the verdict's rate as a line
    [m.kind for m in tl.marks]   # ["peak", "attached", "oom"]
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from memscope.analysis.categories import (MAX_POINTS, CategoryTimeline, LeakGrowth, category_timeline,
                                          leak_growth)
from memscope.analysis.summary import RunSummary
from memscope.analysis.timeline import Timeline, memory_timeline
from memscope.analysis.views import extra_series
from memscope.store.reader import RunReader

MARK_KINDS = ("oom", "evaluation", "attached", "detached")  # events drawn as marks, besides the peak
MAX_MARKS_PER_KIND = 200  # a file with thousands of such events still draws (the first ones)


@dataclass(frozen=True)
class Mark:
    """A moment on the timeline: ``t`` (seconds since the run started) and, for a span (the peak
    step, an evaluation that said when it ended), ``end``."""

    kind: str                  # "peak" | "oom" | "evaluation" | "attached" | "detached"
    t: float
    end: float | None
    step: int | None
    label: str                 # what happened, in words (an event's message: raw data)


@dataclass(frozen=True)
class RunTimeline:
    memory: Timeline                                   # metrics over time, extra series included
    categories: CategoryTimeline
    leaks: list[LeakGrowth] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)


def run_timeline(reader: RunReader, summary: RunSummary, buckets: int = 200,
                 points: int = MAX_POINTS) -> RunTimeline:
    """Every part of the model for the summary's main process."""
    proc = summary.main_proc
    memory = memory_timeline(reader, buckets, proc=proc)
    extra = extra_series(reader, memory, buckets)
    if extra:
        memory = replace(memory, series={**memory.series, **{s.metric: s for s in extra}})
    leaks = summary.leaks
    return RunTimeline(memory, category_timeline(reader, proc, leaks, points),
                       leak_growth(reader, proc, leaks, points),
                       marks(reader, proc, summary.peak.step, memory.origin))


def marks(reader: RunReader, proc: int | None, peak_step: int | None, origin: float | None) -> list[Mark]:
    """The peak step's span, then the events of :data:`MARK_KINDS` (at most
    :data:`MAX_MARKS_PER_KIND` of each), in time order."""
    if origin is None:
        return []
    out: list[Mark] = []
    if proc is not None and peak_step is not None:
        for r in reader.query("SELECT start, end FROM steps WHERE proc = ? AND step = ?", (proc, peak_step)):
            out.append(Mark("peak", float(r["start"]) - origin, float(r["end"]) - origin, peak_step,
                            f"peak step {peak_step}"))
    for kind in MARK_KINDS:
        for r in reader.query("SELECT t, step, message, data FROM events WHERE kind = ? ORDER BY t LIMIT ?",
                              (kind, MAX_MARKS_PER_KIND)):
            t = _number(r["t"])
            if t is None:
                continue  # a damaged row: nothing to place
            end = _number(_data(r["data"]).get("end"))
            step = r["step"] if isinstance(r["step"], int) else None
            out.append(Mark(kind, t - origin, end - origin if end is not None else None, step,
                            str(r["message"] or kind)))
    out.sort(key=lambda m: m.t)
    return out


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        return None
    return float(v)


def _data(text: Any) -> dict[str, Any]:
    try:
        d = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}

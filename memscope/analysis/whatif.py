"""Measured what-ifs: a baseline run file and a trial run file of the same script, compared.

Pure reading (no torch). Two measures of the saving:

* ``peak``: the report's peak (``summarize(reader).peak.bytes``). On CUDA it is the allocator's
  high-water mark: exact, and the measure used. On CPU it is host RSS, which holds the
  interpreter, torch's libraries and whatever the allocator keeps cached: a saving of a few MiB
  drowns in a process of hundreds, and glibc may keep freed pages. Shown, not used, on CPU.
* ``tensor_peak``: the exact peak of live tensor bytes per step (the agent's ``tensor_peak``
  option: every storage alive at the step's start plus every one an op creates, released when
  it dies), the highest over steps 1.. of the run. It is what the CUDA allocator's peak counts,
  without rounding: it sees temporaries, checkpoint recomputation in backward, autocast's
  casts. The measure used on CPU.
* ``breakdown``: parameters + gradients + optimizer state + activations at their peak, from the
  ``step_breakdown`` rows of the per-layer profiler (every step from step 1 in a what-if run),
  the highest total over the profiled steps. Deterministic byte counts, the same kind of figure
  the estimator predicts; shown beside. Its limit: tensors kept alive outside
  autograd's saved tensors (a non-reentrant checkpoint's block inputs, autocast's weight-cast
  cache between ops) are not activations to it, and a checkpointed block's recomputation in
  backward is not counted: for checkpointing it overstates the saving.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from memscope.analysis.summary import summarize
from memscope.store.reader import RunReader

COMPONENTS = ("parameters", "gradients", "optimizer_state", "activations")
TOLERANCE = 0.25  # issue #6: measured within 25% of the estimate
# the checkpointing plan (JSON {"container", "segments"}) a trial applies: the estimator's, so
# that the measured saving is the saving of the plan the suggestion describes


@dataclass
class Measure:
    db: str
    status: str
    exit_code: int | None
    steps: int
    peak_bytes: int | None
    peak_metric: str
    breakdown: dict[str, int] | None  # COMPONENTS + "total", at the step with the highest total
    breakdown_step: int | None
    applied: list[dict[str, Any]] = field(default_factory=list)  # the trial's technique events
    cut_short: bool = False  # ended by --max-steps
    tensor_peak: int | None = None  # highest live tensor bytes of a measured step


@dataclass
class Comparison:
    technique: str
    baseline: Measure
    trial: Measure
    applied: bool
    measured_by: str  # "cuda_allocated", "tensor_peak", "breakdown" or "rss"
    measured_saving_bytes: int | None
    peak_saving_bytes: int | None
    breakdown_saving_bytes: int | None
    tensor_peak_saving_bytes: int | None
    estimated_saving_bytes: int | None  # None: not suggested for this run
    estimate_error: float | None  # (measured - estimated) / estimated
    within_tolerance: bool | None


def measure(reader: RunReader) -> Measure:
    s = summarize(reader)
    rows = reader.query("SELECT * FROM sqlite_master WHERE type = 'table' AND name = 'step_breakdown'")
    best: dict[str, int] | None = None
    best_step = None
    if rows and s.main_proc is not None:
        for r in reader.query("SELECT * FROM step_breakdown WHERE proc = ? ORDER BY step", (s.main_proc,)):
            parts = {k: int(r[k] or 0) for k in COMPONENTS}
            parts["total"] = sum(parts.values())
            if best is None or parts["total"] > best["total"]:
                best, best_step = parts, int(r["step"])
    applied = [e["data"] for e in reader.events("technique") if isinstance(e["data"], dict)]
    peaks = [int(e["data"]["peak_bytes"]) for e in reader.events("tensor_peak")
             if isinstance(e["data"], dict) and e["data"].get("peak_bytes") is not None]
    return Measure(reader.path, s.status, s.exit_code, s.steps, s.peak.bytes, s.peak.metric,
                   best, best_step, applied, bool(reader.events("max_steps")),
                   max(peaks) if peaks else None)


def estimate_for(suggestions: Iterable[Any], technique: str) -> int | None:
    """The estimated saving of ``technique`` among ``Suggestion`` objects (or dicts), if any."""
    for sg in suggestions:
        tech = sg.get("technique") if isinstance(sg, dict) else getattr(sg, "technique", None)
        if tech == technique:
            value = (sg.get("estimated_saving_bytes") if isinstance(sg, dict)
                     else getattr(sg, "estimated_saving_bytes", None))
            return int(value) if value is not None else None
    return None


def compare(technique: str, baseline: Measure, trial: Measure,
            estimated: int | None) -> Comparison:
    # a trial that failed (dcgan: its BCELoss given autocast's bfloat16 output, exit 1 in step 0)
    # measured nothing: its RSS against the baseline's was taken for a 16.9 MiB saving
    done = trial.exit_code == 0
    peak_saving = (baseline.peak_bytes - trial.peak_bytes
                   if done and baseline.peak_bytes is not None and trial.peak_bytes is not None else None)
    bd_saving = (baseline.breakdown["total"] - trial.breakdown["total"]
                 if done and baseline.breakdown and trial.breakdown else None)
    tp_saving = (baseline.tensor_peak - trial.tensor_peak
                 if done and baseline.tensor_peak is not None and trial.tensor_peak is not None else None)
    if baseline.peak_metric == "cuda_allocated":
        measured_by, measured = baseline.peak_metric, peak_saving
    elif tp_saving is not None:
        measured_by, measured = "tensor_peak", tp_saving
    elif bd_saving is not None:
        measured_by, measured = "breakdown", bd_saving
    else:
        measured_by, measured = baseline.peak_metric, peak_saving
    error = within = None
    if estimated and measured is not None:
        error = (measured - estimated) / estimated
        within = abs(error) <= TOLERANCE
    applied = any(a.get("technique") == technique and a.get("applied") for a in trial.applied)
    return Comparison(technique, baseline, trial, applied, measured_by, measured, peak_saving,
                      bd_saving, tp_saving, estimated, error, within)


def to_json(script: str, steps: int, baseline: Measure, comparisons: list[Comparison],
            estimator_note: str | None) -> dict[str, Any]:
    def m(x: Measure) -> dict[str, Any]:
        return {"db": x.db, "status": x.status, "exit_code": x.exit_code, "steps": x.steps,
                "peak_bytes": x.peak_bytes, "peak_metric": x.peak_metric,
                "breakdown": x.breakdown, "breakdown_step": x.breakdown_step,
                "tensor_peak_bytes": x.tensor_peak}

    return {
        "schema": "memscope.whatif/1",
        "script": script,
        "steps": steps,
        "estimator": estimator_note,
        "baseline": m(baseline),
        "trials": [{
            "technique": c.technique, "applied": c.applied,
            "how": [a for a in c.trial.applied if a.get("technique") == c.technique],
            **m(c.trial),
            "measured_by": c.measured_by, "measured_saving_bytes": c.measured_saving_bytes,
            "peak_saving_bytes": c.peak_saving_bytes,
            "breakdown_saving_bytes": c.breakdown_saving_bytes,
            "tensor_peak_saving_bytes": c.tensor_peak_saving_bytes,
            "estimated_saving_bytes": c.estimated_saving_bytes,
            "suggested": c.estimated_saving_bytes is not None,
            "estimate_error": c.estimate_error, "within_tolerance": c.within_tolerance,
        } for c in comparisons],
    }

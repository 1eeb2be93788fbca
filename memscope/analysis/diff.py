"""Comparison of two runs (A, the baseline, and B): peak, breakdown at the peak, per-layer
activation bytes, step time and leaks, with B - A deltas.

Pure functions over two :class:`~memscope.analysis.summary.RunSummary` (no torch). Each side is
its main process (rank 0), as in ``memscope report``; per-rank peaks come along for runs with
several ranks. "Did checkpointing help" is: ``activations`` and the layers' bytes fell, the peak
fell, and the step time rose by the recompute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memscope.analysis.leaks import Leak
from memscope.analysis.summary import RunSummary

SCHEMA = "memscope.diff/1"
BREAKDOWN_KEYS = ("parameters", "gradients", "optimizer_state", "activations", "other")


@dataclass
class Delta:
    a: float | None
    b: float | None

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def ratio(self) -> float | None:
        """B / A; None when either is unknown or A is 0."""
        return None if self.a is None or self.b is None or self.a == 0 else self.b / self.a

    def as_json(self, digits: int | None = None) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return v if v is None or digits is None else round(v, digits)
        ratio = self.ratio
        return {"a": r(self.a), "b": r(self.b), "delta": r(self.delta),
                "ratio": None if ratio is None else round(ratio, 4)}


@dataclass
class LayerDelta:
    module: str
    type: str | None
    bytes: Delta  # activation bytes saved for backward by the module's own forward; 0 when absent


@dataclass
class LeakDelta:
    category: str
    dtype: str | None
    shape: list[int] | None
    grad_fn: str | None
    bytes_per_step: Delta  # None on the side where the group does not leak


@dataclass
class RunDiff:
    a: str
    b: str
    metric: tuple[str, str]  # what each peak measures: "rss" or "cuda_allocated"
    peak: Delta
    peak_step: Delta
    breakdown: dict[str, Delta]
    layer_step: Delta  # the profiled step each side's layer numbers come from
    activations_total: Delta  # sum of the per-layer activation bytes
    layers: list[LayerDelta]
    steps: Delta
    median_step_s: Delta
    leak_bytes_per_step: Delta  # summed over each side's leaks
    leaks: list[LeakDelta]
    rank_peaks: dict[str, Delta] = field(default_factory=dict)  # by rank, for multi-rank runs

    @property
    def same_metric(self) -> bool:
        return self.metric[0] == self.metric[1]


def diff_runs(a: RunSummary, b: RunSummary) -> RunDiff:
    """B compared to A."""
    la = {h.module: h for h in a.hotspots}
    lb = {h.module: h for h in b.hotspots}
    # a module missing on a profiled side saved nothing there (0); a side without any profiled
    # step knows nothing (None)
    za = 0 if a.hotspot_step is not None else None
    zb = 0 if b.hotspot_step is not None else None
    layers = [LayerDelta(m, (lb.get(m) or la[m]).type,
                         Delta(la[m].activation_bytes if m in la else za,
                               lb[m].activation_bytes if m in lb else zb))
              for m in dict.fromkeys([*la, *lb])]
    layers.sort(key=lambda d: (-abs(d.bytes.delta or 0), -(d.bytes.a or 0), d.module))
    bda, bdb = a.peak.breakdown, b.peak.breakdown
    breakdown: dict[str, Delta] = {}
    if bda is not None or bdb is not None:
        breakdown = {k: Delta((bda or {}).get(k), (bdb or {}).get(k)) for k in BREAKDOWN_KEYS}
    return RunDiff(
        a=a.path, b=b.path,
        metric=(a.peak.metric, b.peak.metric),
        peak=Delta(a.peak.bytes, b.peak.bytes),
        peak_step=Delta(a.peak.step, b.peak.step),
        breakdown=breakdown,
        layer_step=Delta(a.hotspot_step, b.hotspot_step),
        activations_total=Delta(sum(h.activation_bytes for h in a.hotspots) if a.hotspot_step is not None else None,
                                sum(h.activation_bytes for h in b.hotspots) if b.hotspot_step is not None else None),
        layers=layers,
        steps=Delta(a.steps, b.steps),
        median_step_s=Delta(a.median_step_s, b.median_step_s),
        leak_bytes_per_step=Delta(sum(lk.bytes_per_step for lk in a.leaks),
                                  sum(lk.bytes_per_step for lk in b.leaks)),
        leaks=_leak_deltas(a.leaks, b.leaks),
        rank_peaks=_rank_peaks(a, b),
    )


def to_json(d: RunDiff) -> dict[str, Any]:
    """The ``memscope.diff/1`` document: every number as {"a", "b", "delta" (B - A), "ratio" (B / A)}."""
    return {
        "schema": SCHEMA,
        "a": d.a,
        "b": d.b,
        "metric": {"a": d.metric[0], "b": d.metric[1], "same": d.same_metric},
        "peak": {**d.peak.as_json(), "step": {"a": d.peak_step.a, "b": d.peak_step.b}},
        "breakdown": {k: v.as_json() for k, v in d.breakdown.items()} or None,
        "activations": {**d.activations_total.as_json(),
                        "profiled_step": {"a": d.layer_step.a, "b": d.layer_step.b}},
        "layers": [{"module": x.module, "type": x.type, **x.bytes.as_json()} for x in d.layers],
        "steps": d.steps.as_json(),
        "median_step_s": d.median_step_s.as_json(6),
        "leaks": {"bytes_per_step": d.leak_bytes_per_step.as_json(),
                  "groups": [{"category": x.category, "dtype": x.dtype, "shape": x.shape,
                              "grad_fn": x.grad_fn, **x.bytes_per_step.as_json()} for x in d.leaks]},
        "ranks": {k: v.as_json() for k, v in d.rank_peaks.items()},
    }


def _leak_deltas(a: list[Leak], b: list[Leak]) -> list[LeakDelta]:
    def key(lk: Leak) -> tuple[Any, ...]:
        return (lk.category, lk.dtype, str(lk.shape), lk.grad_fn)
    ka = {key(lk): lk for lk in a}
    kb = {key(lk): lk for lk in b}
    out = []
    for k in dict.fromkeys([*ka, *kb]):
        lk = kb.get(k) or ka[k]
        out.append(LeakDelta(lk.category, lk.dtype, lk.shape, lk.grad_fn,
                             Delta(ka[k].bytes_per_step if k in ka else None,
                                   kb[k].bytes_per_step if k in kb else None)))
    out.sort(key=lambda x: -max(x.bytes_per_step.a or 0, x.bytes_per_step.b or 0))
    return out


def _rank_peaks(a: RunSummary, b: RunSummary) -> dict[str, Delta]:
    """Peak per rank when either run has more than one process (keyed by rank, else #proc)."""
    if len(a.ranks) < 2 and len(b.ranks) < 2:
        return {}
    def by(s: RunSummary) -> dict[str, int | None]:
        return {(str(r.rank) if r.rank is not None else f"#{r.proc}"): r.peak_bytes for r in s.ranks}
    pa, pb = by(a), by(b)
    return {k: Delta(pa.get(k), pb.get(k)) for k in dict.fromkeys([*pa, *pb])}

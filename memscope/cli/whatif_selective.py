"""``memscope whatif --try selective_checkpointing``: the plan read from the profiled baseline
(its curve, the plan tried, its predicted peak), and what the trial measured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memscope.analysis import sac_plan, step_peaks
from memscope.display import shown_text
from memscope.report.sac_code import policy_code
from memscope.store.reader import RunReader
from memscope.units import human_bytes


@dataclass
class SelectiveTrial:
    profile: sac_plan.BlockProfile | None = None
    backward: sac_plan.Backward | None = None
    baseline_peak: int | None = None
    plan: sac_plan.Point | None = None
    curve: list[sac_plan.Point] = field(default_factory=list)
    why: str = ""
    measured_peak: int | None = None
    optimizer_peak: int | None = None  # the baseline's optimizer step's own peak (step_peaks)

    @classmethod
    def from_baseline(cls, reader: RunReader, baseline_peak: int | None) -> "SelectiveTrial":
        try:
            found = sac_plan.from_events(reader.events("sac_profile"), reader.events("sac_live"))
        except ValueError as exc:
            return cls(why=str(exc))
        if found is None:
            refused = [e["data"].get("why") for e in reader.events("technique") if isinstance(e.get("data"), dict)
                       and e["data"].get("technique") == "sac_profile" and e["data"].get("why")]
            return cls(why=str(refused[0]) if refused else
                       "the baseline recorded no block profile (no repeated blocks called under grad)")
        profile, backward = found
        peaks = step_peaks.of_run(reader)
        return cls(profile, backward, baseline_peak, sac_plan.suggested(profile), sac_plan.curve(profile),
                   optimizer_peak=peaks.optimizer if peaks is not None else None)

    @property
    def ok(self) -> bool:
        return self.plan is not None

    @property
    def save(self) -> list[str]:
        return list(self.plan.save or ()) if self.plan is not None else []

    def predicted(self, pt: sac_plan.Point) -> int | None:
        if self.profile is None or self.baseline_peak is None or self.backward is None:
            return None
        return sac_plan.predicted_peak(self.baseline_peak, self.backward, self.profile, pt, self.optimizer_peak)

    def as_json(self) -> dict[str, Any]:
        if self.profile is None or self.plan is None:
            return {"plan": None, "why": self.why}
        return {"container": self.profile.container, "block_type": self.profile.block_type,
                "blocks": self.profile.blocks, "baseline_peak_bytes": self.baseline_peak,
                "plan": sac_plan.technique_json(self.profile, self.plan),
                "predicted_peak_bytes": self.predicted(self.plan), "measured_peak_bytes": self.measured_peak,
                "curve": [sac_plan.point_json(pt, self.predicted(pt)) for pt in self.curve]}

    def render(self) -> str:
        if self.profile is None or self.plan is None:
            return f"selective checkpointing: no plan: {shown_text(self.why)}"
        p = self.profile
        lines = [f"selective checkpointing: {p.blocks} {shown_text(p.block_type)} blocks in "
                 f"{shown_text(p.container or '<root>')}; the memory / recompute curve (per step):"]
        table = [["plan", "activations kept", "recompute FLOPs", "predicted peak"]]
        for pt in self.curve:
            pred = self.predicted(pt)
            table.append([pt.label, human_bytes(pt.activation_bytes),
                          f"{_flops(pt.recompute_flops)} ({pt.recompute_flops_pct:.0f}%)",
                          human_bytes(pred) if pred is not None else "-"])
        widths = [max(len(r[i]) for r in table) for i in range(4)]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
        pred = self.predicted(self.plan)
        lines.append(f"  tried: {self.plan.label}: predicted peak "
                     f"{human_bytes(pred) if pred is not None else '-'}, measured "
                     f"{human_bytes(self.measured_peak) if self.measured_peak is not None else '-'}")
        lines.append("  the plan as code:")
        lines += ["    " + line if line else "" for line in
                  policy_code(self.save, p.container, shown_text(p.block_type)).splitlines()]
        return "\n".join(lines)


def _flops(n: int) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}FLOP"
    return f"{n} FLOP"

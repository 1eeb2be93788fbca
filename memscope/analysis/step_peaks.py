"""A step's two peaks: its forward and backward's, and its optimizer step's. Pure (no torch).

A training step peaks twice: in backward (the activations saved for it, the gradients it makes)
and in the optimizer's step (the gradients, the states, the update's temporaries: Adam's square
root of the second moment and its denominator, a parameter's size each). When they are close, a
technique that lowers one lowers the step's peak only down to the other: on pytorch/examples'
mnist at batch 20, autocast takes 2.75 MiB off backward's peak, which lies 1.02 MiB above the
optimizer step's, and the step's peak falls by those 1.02 MiB. The saving at the peak is the
peak now less ``max(the model side lowered, the optimizer side lowered)``, each side as the
measured step reached it (the ``tensor_peak`` event's ``phases``, memscope.agent.collectors.
tensor_peak.TensorPeak).

Not known (None): a run from before the event carried ``phases``, a step that measured no
optimizer step, a run judged at an out-of-memory error (another moment than the measured
step's), and an optimizer that evaluates a closure (LBFGS: its forwards and backwards run inside
its step, so its step's peak is the model's too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memscope.store.reader import RunReader
from memscope.units import human_bytes

OPTIMIZER = "optimizer"


@dataclass(frozen=True)
class StepPeaks:
    """Live tensor bytes of the measured step: the highest outside the optimizer's step (the
    forward, the backward, the loop around them), the highest in it, and what was live when the
    stretch of the optimizer's step holding that peak began (its first new tensor)."""

    model: int
    optimizer: int
    optimizer_start: int

    @property
    def peak(self) -> int:
        return max(self.model, self.optimizer)

    @property
    def optimizer_temporaries(self) -> int:
        """What the optimizer's step adds at most to what was live when it began."""
        return max(0, self.optimizer - self.optimizer_start)

    def after(self, model: int = 0, optimizer: int = 0) -> int:
        """The step's peak once a change takes ``model`` bytes off the model side's peak and
        ``optimizer`` off the optimizer step's."""
        return max(self.model - model, self.optimizer - optimizer)

    def saving(self, model: int = 0, optimizer: int = 0) -> int:
        """The peak now less :meth:`after`."""
        return self.peak - self.after(model, optimizer)

    def capped(self, model: int) -> str:
        """Words for a model-side saving the optimizer's step caps ('' when it does not)."""
        if self.saving(model) >= model:
            return ""
        return (f"; but the optimizer's step peaks at {human_bytes(self.optimizer)} (live tensors, measured), "
                f"{human_bytes(max(0, self.model - self.optimizer))} below the step's "
                f"{human_bytes(self.model)} in its forward and backward: the step's peak falls to it, not below, so "
                f"{human_bytes(self.saving(model))} of the {human_bytes(model)} are saved at the peak")


def from_event(data: Any) -> StepPeaks | None:
    """The two peaks of a ``tensor_peak`` event's data (None: not recorded, or no optimizer
    step in the measured step)."""
    phases = data.get("phases") if isinstance(data, dict) else None
    if not isinstance(phases, dict):
        return None
    peaks: dict[str, tuple[int, int]] = {}
    for name, d in phases.items():
        if isinstance(d, dict) and isinstance(d.get("peak_bytes"), int) and isinstance(d.get("start_bytes"), int):
            peaks[str(name)] = (int(d["peak_bytes"]), int(d["start_bytes"]))
    opt = peaks.pop(OPTIMIZER, None)
    if opt is None or not peaks:
        return None
    model = max(p for p, _ in peaks.values())
    found = StepPeaks(model, opt[0], opt[1])
    return found if found.peak == data.get("peak_bytes") else None  # a damaged event: not read


def top_event(reader: RunReader) -> dict[str, Any]:
    """The data of the run's highest measured step's ``tensor_peak`` event ({} when none)."""
    peaks = [e["data"] for e in reader.events("tensor_peak")
             if isinstance(e["data"], dict) and isinstance(e["data"].get("peak_bytes"), int)]
    return max(peaks, key=lambda d: int(d["peak_bytes"])) if peaks else {}


def of_run(reader: RunReader) -> StepPeaks | None:
    """The two peaks of the run's highest measured step (its ``tensor_peak`` events)."""
    top = top_event(reader)
    return from_event(top) if top else None

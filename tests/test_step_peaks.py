"""A step's peak in each phase (memscope.agent.collectors.tensor_peak.TensorPeak.phases), in this
process on CPU tensors whose sizes are known, and the two peaks the advice reads from them
(memscope.analysis.step_peaks). The advice's figures against whatif on a real script whose two
peaks are close: tests/test_advice_accuracy.py (test_a_saving_stops_at_the_steps_other_peak)."""

from __future__ import annotations

import torch

from memscope.agent.collectors.tensor_peak import TensorPeak
from memscope.analysis.step_peaks import StepPeaks, from_event

MB = 1 << 20


def _floats(nbytes: int) -> torch.Tensor:
    return torch.ones(nbytes // 4)  # a new storage, made through the counter's dispatch mode


def test_each_phase_keeps_its_peak_and_where_its_stretch_began() -> None:
    """forward (``other``) makes 2 MiB; backward 3 MiB more, then frees the forward's; the
    optimizer's step begins with the backward's 3 MiB live and adds 1.5 MiB of temporaries.
    The optimizer's stretch begins where backward left it, not at the step's start (the Adam
    temporaries are what it adds to that)."""
    phase = ["other"]
    tp = TensorPeak(phase=lambda: phase[0])
    held = _floats(MB)  # live at the step's start
    tp.begin(0, lambda: [held])
    start = tp.start
    try:
        a, b = _floats(MB), _floats(MB)
        phase[0] = "backward"
        c = _floats(3 * MB)
        del a, b
        phase[0] = "optimizer"
        t1 = _floats(MB)
        t2 = _floats(MB // 2)
        del t1, t2
        phase[0] = "other"
        tp.phases()  # readable during the step
    finally:
        tp.end()
    assert start == MB
    assert tp.phases() == {"other": {"peak_bytes": start + 2 * MB, "start_bytes": start},
                           "backward": {"peak_bytes": start + 5 * MB, "start_bytes": start + 2 * MB},
                           "optimizer": {"peak_bytes": start + 4.5 * MB, "start_bytes": start + 3 * MB}}
    assert tp.peak == start + 5 * MB and tp.phase_at_peak == "backward"
    del c
    peaks = from_event({"peak_bytes": tp.peak, "phases": tp.phases()})
    assert peaks == StepPeaks(model=start + 5 * MB, optimizer=start + 4.5 * MB, optimizer_start=start + 3 * MB)
    assert peaks.optimizer_temporaries == 1.5 * MB
    # 2 MiB off the forward and backward: the step's peak falls 0.5 MiB, to the optimizer's
    assert peaks.saving(model=2 * MB) == MB // 2 and peaks.saving(optimizer=MB) == 0


def test_a_closure_evaluated_in_the_optimizers_step_gives_no_two_sides() -> None:
    """LBFGS (or Lightning's closure): the forward runs in the optimizer's step and its backward
    after it: the optimizer's peak is the model's too, and the event carries no ``phases``."""
    phase = ["other"]
    tp = TensorPeak(phase=lambda: phase[0])
    tp.begin(0, lambda: [])
    try:
        phase[0] = "optimizer"
        x = _floats(MB)  # the closure's forward
        phase[0] = "backward"
        y = _floats(MB)
        phase[0] = "optimizer"
        z = _floats(MB // 4)
    finally:
        tp.end()
    assert tp.phases() == {} and tp.peak == 2.25 * MB
    assert from_event({"peak_bytes": tp.peak, "phases": tp.phases()}) is None
    del x, y, z


def test_an_event_without_both_sides_or_damaged_is_not_read() -> None:
    assert from_event({"peak_bytes": 10}) is None  # a file from before the phases
    assert from_event({"peak_bytes": 10, "phases": {"backward": {"peak_bytes": 10, "start_bytes": 2}}}) is None
    two = {"other": {"peak_bytes": 7, "start_bytes": 1}, "optimizer": {"peak_bytes": 9, "start_bytes": 4}}
    assert from_event({"peak_bytes": 9, "phases": two}) == StepPeaks(7, 9, 4)
    assert from_event({"peak_bytes": 12, "phases": two}) is None  # the phases do not reach the peak
    assert from_event({"peak_bytes": 9, "phases": {**two, "other": {"peak_bytes": "7"}}}) is None

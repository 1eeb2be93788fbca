"""The exact live-tensor peak of one step on a plain run (defaults), for the suggestions.

A ``memscope whatif`` baseline measures every step (the ``tensor_peak`` option: a gc walk and a
Python call per op). A plain run measures ONE step after warm-up with the same
:class:`~memscope.agent.collectors.tensor_peak.TensorPeak` and removes it: the suggestions then
know the working set beside the activations (the logits, a float32 copy for the loss, the loss's
gradient), which scales with the micro-batch as the activations do. Its ``tensor_peak`` event
carries ``"one_step": true``.

Not measured (the reading side does without, or has better):
* on CUDA: the allocator's peak of each step is in the steps table already (``peak_allocated``,
  the exact high-water mark, read without resetting the program's counters);
* under ``torch.compile`` (a dispatch mode on the stack would make Dynamo recompile or fall
  back; a script that first compiles during the measured step gets the step dropped: the mode
  tells Dynamo to set it aside while compiling, so the compiled code's ops go unseen), or
  while a TorchDispatchMode of the program's is active (ours would sit under or over it): an
  event ``tensor_peak_skipped`` says why;
* with per-layer profiling off (no breakdown to read it beside), or where the ``tensor_peak``
  option measures every step already.

Priced as it goes (memscope.agent.collectors.measure_budget): a step whose optimizer evaluates a
closure again and again (LBFGS) is measured over its first evaluations only, once the
measurement has cost its share; the event then says over how many of how many
(``closure_evaluations_measured``, ``closure_evaluations``) and a ``measure_bounded`` event
gives the report its line.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from memscope.agent.collectors.measure_budget import Measure, bounded_message
from memscope.agent.collectors.tensor_peak import TensorPeak, dispatch_mode_on_top
from memscope.agent.runtime.config import AgentOptions
from memscope.agent.torchcompat.compiled import compile_used
from memscope.constants import WARMUP_STEPS

if TYPE_CHECKING:
    from memscope.agent.collectors.host import CollectorHost


def peak_step(options: AgentOptions) -> int | None:
    """The step measured: the first from WARMUP_STEPS on (optimizer state made, caches warm)
    that the layer profile does not instrument (its hooks would slow the ops it times); None:
    not measured."""
    if options.tensor_peak or options.layers_every <= 0:
        return None
    step = WARMUP_STEPS
    while options.profiles_layers(step) and step < WARMUP_STEPS + 2:  # every step profiled: share one
        step += 1
    if options.max_steps and step >= options.max_steps:
        return None
    return step


class PeakStep:
    """``step_opening(n)`` at the boundary before step n, ``step_closed(n)`` at the one after it
    (before ``--max-steps`` can end the process there), ``stop()`` at agent stop."""

    def __init__(self, host: "CollectorHost", on_cuda: Callable[[], bool],
                 live_tensors: Callable[[], list[Any] | None] | None = None) -> None:
        self.host = host
        self.on_cuda = on_cuda
        self.live_tensors = live_tensors  # the registry of live tensors: no gc walk
        self.step = peak_step(host.options)
        self.peak: TensorPeak | None = None
        self.measure = Measure()

    def step_opening(self, step: int, trained_s: float = 0.0) -> None:
        """``trained_s``: the training thread's CPU time so far (the measurement's budget)."""
        if step != self.step or not self.host.running:
            return
        try:
            why = self._skip_reason()
            if why is None:
                self.peak = TensorPeak(outside_compile=True, phase=lambda: self.host.phase)  # not under compile
                self.measure.start(time.thread_time(), trained_s)
                self.peak.begin(step, self.live_tensors)
            elif why:
                self.host.event("tensor_peak_skipped", f"step {step}: live tensor peak not measured: {why}",
                                {"step": step, "why": why})
        except Exception as exc:
            self._failed(exc)

    def _skip_reason(self) -> str | None:
        """Why the step is not measured ('' : the allocator measures it), or None."""
        if self.on_cuda():
            return ""
        if compile_used():
            return "torch.compile is in use (a dispatch mode would make it recompile)"
        mode = dispatch_mode_on_top()
        if mode is not None:
            return f"the program's {type(mode).__name__} (a TorchDispatchMode) is active"
        return None

    def backward_end(self, closure: bool, now: float, backwards: int, closures: int) -> None:
        """At the end of a backward of the measured step (CPU time ``now``, the tracker's counts
        so far): stop measuring when a closure evaluation has made it cost its share."""
        peak = self.peak
        if peak is None or not peak.active or not self.measure.due_cut(closure, now):
            return
        try:
            self.measure.cut(now, backwards, closures)
            peak.end()  # its peak and start stay readable for step_closed
        except Exception as exc:
            self._failed(exc)

    def step_closed(self, step: int, backwards: tuple[int, int] = (0, 0)) -> None:
        """``backwards``: the step tracker's counts of the closed step (backward passes, closure
        evaluations among them)."""
        peak = self.peak
        if peak is None or peak.step is None or step < peak.step:
            if peak is not None and peak.stuck is not None:
                peak.leave()  # a mode the program held over ours at the step's end: gone now?
            return
        try:
            uncounted, grads = peak.uncounted, peak.grads_at_peak
            high, start = peak.end()
            if step == peak.step and compile_used():  # compiled during the step: its ops unseen
                self.host.event("tensor_peak_skipped", f"step {step}: live tensor peak not measured: "
                                "torch.compile ran during the step (the compiled code's tensors are "
                                "not all seen)", {"step": step, "why": "torch.compile ran during the step"})
            elif step == peak.step:
                missed = f" ({uncounted} tensor(s) without a storage not counted)" if uncounted else ""
                data = {"step": step, "peak_bytes": high, "start_bytes": start,
                        "start_grad_bytes_at_peak": grads, "uncounted_tensors": uncounted, "one_step": True,
                        "phase": peak.phase_at_peak, "phases": peak.phases()}
                over = ""
                if self.measure.cut_at is not None:
                    measured = self.measure.cut_at[1]
                    total = measured + self.measure.unmeasured(*backwards)[1]
                    data.update(closure_evaluations_measured=measured, closure_evaluations=total)
                    over = f", over its first {measured} of {total} closure evaluations"
                    self.host.event("measure_bounded", bounded_message(
                        step, "the live tensor peak was measured", measured, total, self.measure.cost_at_cut),
                        {"step": step, "what": "tensor_peak", "measured": measured, "total": total})
                self.host.event("tensor_peak", f"step {step}: live tensor bytes peaked at {high}{missed} "
                                               f"(one measured step{over})", data)
            peak.step = None
            if peak.stuck is None:
                self.peak = None
            else:  # kept to try again at the next boundaries
                self.host.event("warning", f"tensor_peak: {type(dispatch_mode_on_top()).__name__}, a "
                                           "dispatch mode the program entered during the measured step, "
                                           "is still on top of memscope's (a pass-through from now on)")
        except Exception as exc:
            self._failed(exc)

    def stop(self) -> None:
        """At agent stop: a step cut short is not written."""
        if self.peak is not None:
            try:
                self.peak.end()
            except Exception:
                pass

    def after_fork(self) -> None:
        """In a forked DataLoader worker: the inherited mode counts nothing."""
        if self.peak is not None:
            self.peak.active = False

    def _failed(self, exc: BaseException) -> None:
        if self.peak is not None:
            try:
                self.peak.end()
            except Exception:
                pass
        self.peak = None
        self.host.event("collector_disabled", f"tensor_peak: {type(exc).__name__}: {exc}")

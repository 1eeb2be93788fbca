"""How much of a measured step the costly measurements take: priced as the step goes.

Two measurements instrument a whole step on a default run: the layer profile (step 1, then every
``layers_every``: a hook per module call, per saved tensor and per graph node) and the one-step
live-tensor peak (memscope.agent.collectors.peak_step: a Python call per op). Each multiplies the
time of the ops it sees by 3 to 4. On a step of one forward and backward that is paid once in a
run of many steps. An optimizer that evaluates a closure (LBFGS: up to 25 forwards and backwards
per ``optimizer.step``) makes every step many-op, and on a run of a few such steps
(pytorch/examples' time_sequence_prediction: 3 to 15) the two measured steps cost 1.6-2.2x the
whole run's CPU.

The optimizer's later evaluations repeat the first (the same closure, the same model, the same
batch), so a measured step stops measuring at the end of a closure evaluation's backward once
the measurement has cost more than ``SHARE`` of the training time so far plus ``ALLOWANCE_S``:
the step's layer rows are then those of the evaluations measured (one forward's saving, as
they are for every closure step), its live-tensor peak that of the evaluations measured, and an
event says so (``measure_bounded``: one line in ``memscope report``). The rest of the step runs
without the measurement; its evaluations are still counted (the tracker counts backward passes).

Micro-batches the script accumulates outside an optimizer step are never cut: they may differ
(a smaller last batch, a GAN's second model), and the later ones carry the gradients the first
left (the peak of an accumulating step is in a later micro-batch).

The cost charged is the training thread's CPU time since the measurement began (the measured
part of the step whole, an upper bound on what the measurement added); the training so far is
the same thread's CPU time since recording began (what the run's CPU is: a wall-time basis
would grow with the machine's load and let a loaded run measure more).
"""

from __future__ import annotations

SHARE = 0.05
ALLOWANCE_S = 0.1


class Measure:
    """One measured step's price: begun at its boundary, asked at each closure backward. Times
    are the training thread's CPU seconds (``time.thread_time()``), passed in."""

    def __init__(self) -> None:
        self.began: float | None = None  # CPU time when the measurement began
        self.budget_s = ALLOWANCE_S  # what it may cost
        self.cut_at: tuple[int, int] | None = None  # (backwards, closure backwards) at the cut
        self.cost_at_cut = 0.0  # CPU seconds the measurement took until the cut

    def start(self, now: float, trained_s: float) -> None:
        """Begun at CPU time ``now`` after ``trained_s`` of the training thread's CPU."""
        self.began = now
        self.budget_s = SHARE * max(trained_s, 0.0) + ALLOWANCE_S
        self.cut_at = None
        self.cost_at_cut = 0.0

    def due_cut(self, closure: bool, now: float) -> bool:
        """At the end of a backward of the measured step: whether to stop measuring now (only
        after a closure evaluation, once over budget, once)."""
        return closure and self.began is not None and self.cut_at is None \
            and now - self.began > self.budget_s

    def cut(self, now: float, backwards: int, closures: int) -> None:
        """Stopped at CPU time ``now``, at the tracker's counts of the step so far."""
        self.cut_at = (backwards, closures)
        self.cost_at_cut = now - self.began if self.began is not None else 0.0

    def unmeasured(self, backwards: int, closures: int) -> tuple[int, int]:
        """At the step's end (the tracker's counts of the whole step): the backwards and
        closure evaluations that ran after the cut, (0, 0) without one."""
        if self.cut_at is None:
            return 0, 0
        return max(0, backwards - self.cut_at[0]), max(0, closures - self.cut_at[1])


def bounded_message(step: int, what: str, measured: int, total: int, cost_s: float) -> str:
    """The one line a bounded measurement leaves in the report."""
    return (f"step {step}: {what} over its first {measured} of {total} closure evaluations "
            f"(the optimizer's later ones repeat it; measuring them would have cost about "
            f"{cost_s / max(measured, 1) * max(total - measured, 0):.1f} s more of CPU)")

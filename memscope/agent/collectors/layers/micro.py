"""A profiled step's micro-batches, and which one's per-module stats become its rows.

A forward after a backward starts the next micro-batch (gradient accumulation). The rows are one
micro-batch's, never a sum over those of the step: the one that saved the most (the earliest on a
tie), so they bound the step's peak as one forward does. A module that did not run in it (a
second model with a backward of its own) keeps its own largest micro-batch.
"""

from __future__ import annotations

from typing import Any, Callable

from memscope.agent.collectors.layers.stats import NO_MODULE, ModuleStats

StatsKey = tuple[int, int]  # (id(root), id(module))


class _Micro:
    """One micro-batch's per-module stats (or, for ``_others``, each module's largest)."""

    def __init__(self, stats: dict[StatsKey, ModuleStats] | None = None,
                 no_module: ModuleStats | None = None) -> None:
        self.stats = stats if stats is not None else {}
        self.no_module = no_module

    def keep_largest(self, other: _Micro) -> None:
        """Keep, per module, whichever of self's and ``other``'s saved more (self's on a tie)."""
        for key, st in other.stats.items():
            kept = self.stats.get(key)
            if kept is None or st.saved_bytes > kept.saved_bytes:
                self.stats[key] = st
        nm = other.no_module
        if nm is not None and (self.no_module is None or nm.saved_bytes > self.no_module.saved_bytes):
            self.no_module = nm


class MicroBatches:
    """The stats of the micro-batch in progress (``stats``, ``no_module``) and the fold of the
    finished ones. ``count`` and ``closure_forwards`` stay readable after :meth:`finish`."""

    def __init__(self, in_optimizer: Callable[[], bool]) -> None:
        # whether the training thread is inside optimizer.step(): forwards there are a
        # closure's evaluations (LBFGS), not micro-batches the script accumulates
        self._in_optimizer = in_optimizer
        self.reset()

    def reset(self) -> None:
        """A new step (in place: the parts given :meth:`backward_seen` keep it)."""
        self.stats: dict[StatsKey, ModuleStats] = {}
        self.no_module = ModuleStats(NO_MODULE, "")
        self.count = 1
        self.closure_forwards = 0  # micro-batches of the step that began inside optimizer.step()
        self.open = False  # the micro-batch in progress has had its first forward
        self.bw_seen = False  # a backward ran since the micro-batch in progress began
        self._best = _Micro()  # the finished micro-batch that saved the most so far
        self._best_total = -1
        self._others = _Micro()  # each module's largest in the other micro-batches

    def backward_seen(self) -> None:
        self.bw_seen = True

    def module_stats(self, module: Any, root_id: int) -> ModuleStats:
        key = (root_id, id(module))
        st = self.stats.get(key)
        if st is None:
            st = self.stats[key] = ModuleStats("", type(module).__name__)
        return st

    def root_forward(self) -> None:
        """A counted forward of a root (a module called with an empty stack)."""
        if self.bw_seen:
            self.next()  # a forward after a backward: the next micro-batch
        if not self.open:
            self.open = True
            self.closure_forwards += bool(self._in_optimizer())

    def next(self) -> None:
        self._fold()
        self.count += 1
        self.bw_seen = False
        self.open = False

    def _fold(self) -> None:
        """End of a micro-batch: keep it if it saved the most so far."""
        done = _Micro(self.stats, self.no_module if self.no_module.saved_tensors else None)
        total = sum(st.saved_bytes for st in done.stats.values()) + self.no_module.saved_bytes
        if total > self._best_total:
            done, self._best = self._best, done
            self._best_total = total
        self._others.keep_largest(done)
        self.stats = {}
        self.no_module = ModuleStats(NO_MODULE, "")

    def finish(self) -> tuple[dict[StatsKey, ModuleStats], ModuleStats]:
        """End of the step: the rows' stats (the largest micro-batch's, each other module's
        largest) and the saving outside every module."""
        self._fold()
        best, others = self._best, self._others
        stats = {**others.stats, **best.stats}
        nm = best.no_module if best.no_module is not None else others.no_module
        self._best, self._others = _Micro(), _Micro()
        return stats, nm if nm is not None else ModuleStats(NO_MODULE, "")

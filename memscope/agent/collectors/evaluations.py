"""Evaluations, for the timeline's marks: the time a model spends in eval mode (``model.eval()``
until ``model.train()``), as the sampler sees it.

Read by the sampler (every sample, and at step boundaries): the ``training`` flag of the models
seen on profiled steps that have parameters (a loss module has none and never counts). Nothing
of the training's is wrapped (``Module.train`` stays torch's): an evaluation shorter than a
sampling interval may go unseen, and such a mark would be too thin to draw anyway. A step
boundary ends one (the model trained since): where the model is still in eval mode there, it is
training in eval mode (frozen batch norm, say), not an evaluation, and nothing is written. A
model left in eval mode when recording ends is closed at that moment.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

MAX_EVALUATIONS = 1000  # per process: a script toggling eval mode every step makes no timeline marks worth 1e6 rows

# (start time, end time, first step, last step, the model's class)
Write = Callable[[float, float, "int | None", "int | None", str], None]


class EvaluationWatch:
    def __init__(self, models: Callable[[], list[Any]], write: Write) -> None:
        self._models = models
        self._write = write
        self._has_params: dict[int, tuple[weakref.ReferenceType[Any], bool]] = {}
        self._open: tuple[float, int | None, str] | None = None  # (start, step, class) of the one in progress
        self.written = 0

    def observe(self, t: float, step: int | None) -> None:
        """One look at the models' modes (the sampler's thread or a step boundary)."""
        in_eval = self._in_eval()
        if in_eval is not None and self._open is None:
            self._open = (t, step, in_eval)
        elif in_eval is None and self._open is not None:
            self._close(t, step)

    @property
    def in_progress(self) -> bool:
        return self._open is not None

    def boundary(self, t: float, step: int | None) -> None:
        """A step ended while an evaluation was open (samples can miss the short training
        between two evaluations)."""
        if self._open is None:
            return
        if self._in_eval() is not None:
            self._open = None  # steps run in eval mode: training, not an evaluation
        else:
            self._close(t, step)

    def finish(self, t: float, step: int | None) -> None:
        """Recording ends: an evaluation in progress ends here."""
        if self._open is not None:
            self._close(t, step)

    def _close(self, t: float, step: int | None) -> None:
        start, first, name = self._open or (t, step, "")
        self._open = None
        if self.written < MAX_EVALUATIONS:
            self.written += 1
            self._write(start, t, first, step, name)

    def _in_eval(self) -> str | None:
        """The class of a model with parameters that is in eval mode now, or None."""
        for m in self._models():
            if getattr(m, "training", True) is False and self._parameters(m):
                return type(m).__name__
        return None

    def _parameters(self, m: Any) -> bool:
        """Whether ``m`` has parameters (asked once per model: its tree is walked)."""
        known = self._has_params.get(id(m))
        if known is not None and known[0]() is m:
            return known[1]
        try:
            has = next(iter(m.parameters()), None) is not None
        except Exception:
            has = False
        try:
            self._has_params[id(m)] = (weakref.ref(m), has)
        except TypeError:
            pass
        return has

"""Step boundaries, found without touching the training script.

Three modes, chosen as the run shows itself:

* ``optimizer``: a step ends when the *clock* optimizer's ``step()`` returns. The clock is the
  first optimizer that steps; with several (a GAN's D and G) the others step inside the clock's
  steps, so the count is one per iteration. If the clock is garbage collected, the next
  optimizer to step becomes the clock.
* ``backward``: no optimizer exists when the first backward finishes (parameters updated by
  hand): a step is a forward under grad mode and its backward, and ends when the outermost
  ``torch.autograd.backward`` returns. Evaluation under ``no_grad`` has no backward: no step.
* ``manual``: the script called ``memscope.step()``; automatic detection is then off.

Hooks: the global optimizer step pre/post hooks, and a thin wrapper around
``torch.autograd.backward`` (``Tensor.backward`` calls it). Neither touches a tensor. Both do
nothing while Dynamo traces (``torch.compile``), so they never break a graph; an optimizer
step compiled into a graph therefore marks no step (mark them with ``memscope.step()``).
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any, Callable

import torch

from memscope.agent.torchcompat.compiled import is_compiling, runtime_only

CloseFn = Callable[[int, float, float], None]


class StepTracker:
    def __init__(self, on_close: CloseFn) -> None:
        self._on_close = on_close
        self._lock = threading.Lock()
        self.step = 0  # the step in progress; also the number of completed steps
        self.step_start = time.time()
        self.mode: str | None = None
        self.phase = "other"
        self._clock: weakref.ReferenceType[Any] | None = None
        self._backward_depth = threading.local()
        self._handles: list[Any] = []
        self._orig_backward: Callable[..., Any] | None = None
        self.enabled = True
        self._activity = False  # a backward or optimizer step happened in the current step
        self.optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()  # every optimizer that stepped
        self.on_error: Callable[[BaseException], None] | None = None  # an exception in backward
        # a step boundary that failed (its row may be lost): counted and said, never silent
        self.on_close_error: Callable[[int, BaseException], None] | None = None
        self.close_errors = 0
        # attached to a running process: the first boundary only marks where step 0 starts (the
        # step in progress began before memscope was there); ``on_anchor(t)`` is told
        self.anchor_pending = False
        self.on_anchor: Callable[[float], None] | None = None
        self._at_backward: list[Callable[[], None]] = []  # jobs for the training thread, see install
        # outermost backward passes of the step in progress, and those run inside an optimizer's
        # step() (a closure it evaluates: LBFGS); the closed step's, at its boundary
        self.backwards = self.closure_backwards = 0
        self.closed_backwards = (0, 0)
        # told after each outermost backward (True: it ran inside optimizer.step()); set only
        # while a step is measured (memscope.agent.collectors.measure_budget)
        self.on_backward_end: Callable[[bool], None] | None = None

    # -- install / remove ----------------------------------------------------------------------

    @runtime_only
    def install(self, optimizer_hooks_now: bool = True) -> None:
        """``optimizer_hooks_now=False`` (attached to a running process whose program has global
        optimizer hooks of its own): they are registered at the next ``backward`` instead, on the
        training thread, where no optimizer step iterates them."""
        if optimizer_hooks_now:
            self._register_optimizer_hooks()
        else:
            self._at_backward.append(self._register_optimizer_hooks)
        orig = torch.autograd.backward
        self._orig_backward = orig
        tracker = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            if tracker._at_backward and not is_compiling():
                tracker._run_at_backward()
            if is_compiling() or not tracker.enabled:
                return orig(*args, **kwargs)
            depth = getattr(tracker._backward_depth, "n", 0)
            tracker._backward_depth.n = depth + 1
            prev_phase, tracker.phase = tracker.phase, "backward"
            try:
                return orig(*args, **kwargs)
            except BaseException as exc:
                on_error = tracker.on_error
                if on_error is not None:
                    try:
                        on_error(exc)  # records an OOM; the same exception goes on, unchanged
                    except Exception:
                        pass
                raise
            finally:
                tracker._backward_depth.n = depth
                tracker.phase = prev_phase
                if depth == 0:
                    tracker._after_backward(prev_phase == "optimizer")

        backward.__wrapped__ = orig  # type: ignore[attr-defined]
        backward.__doc__ = orig.__doc__
        torch.autograd.backward = backward

    def remove(self) -> None:
        self.enabled = False
        self._at_backward.clear()
        self.remove_hooks()
        self._unpatch_backward()

    def disable(self, then: Callable[[], None] | None = None) -> None:
        """Stop marking steps; the rest waits for the next ``backward`` (on the training thread,
        outside any optimizer step): unregister the optimizer hooks (removing one while torch
        iterates over them, inside an optimizer's step where a detach at a step boundary runs,
        breaks that step), put ``torch.autograd.backward`` back, then ``then()``. Until then
        every hook is inert."""
        self.enabled = False

        def later() -> None:
            self.remove_hooks()
            self._unpatch_backward()
            if then is not None:
                then()

        self._at_backward.append(later)

    def _unpatch_backward(self) -> None:
        current = getattr(torch.autograd.backward, "__wrapped__", None)
        if self._orig_backward is not None and current is self._orig_backward:
            torch.autograd.backward = self._orig_backward  # type: ignore[assignment]
        self._orig_backward = None

    def _register_optimizer_hooks(self) -> None:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self._handles.append(register_optimizer_step_pre_hook(self._optimizer_pre))
        self._handles.append(register_optimizer_step_post_hook(self._optimizer_post))

    def _run_at_backward(self) -> None:
        while self._at_backward:
            job = self._at_backward.pop(0)
            try:
                job()
            except Exception:  # noqa: BLE001 - inert hooks left are better than a broken step
                pass

    def remove_hooks(self) -> None:
        """Unregister the optimizer hooks (outside any optimizer step of this thread)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # -- events --------------------------------------------------------------------------------

    def manual_step(self) -> None:
        with self._lock:
            if self.mode not in (None, "manual") and not self._activity:
                # The first memscope.step() right after an automatic boundary (an optimizer
                # step just closed this step): adopt manual mode without an empty extra step.
                self.mode = "manual"
                return
            self.mode = "manual"
            self._close(time.time())

    @runtime_only
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if is_compiling():
            return
        self.phase = "optimizer"

    @runtime_only
    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if is_compiling():
            return
        self.phase = "other"
        if not self.enabled:
            return
        try:
            self.optimizers.add(optimizer)
        except TypeError:
            pass
        with self._lock:
            self._activity = True
            if self.mode == "manual":
                return
            self.mode = "optimizer"
            clock = self._clock() if self._clock is not None else None
            if clock is None:
                self._clock = weakref.ref(optimizer)
                clock = optimizer
            if clock is optimizer:
                self._close(time.time())

    def _after_backward(self, in_optimizer: bool) -> None:
        self.backwards += 1
        if in_optimizer:
            self.closure_backwards += 1
            told = self.on_backward_end
            if told is not None:
                try:
                    told(True)
                except Exception:  # noqa: BLE001 - never into the training step
                    pass
        with self._lock:
            self._activity = True
            if self.mode is None:
                # Decided once: an optimizer that exists now will step and mark the steps.
                self.mode = "optimizer" if _any_optimizer_alive() else "backward"
            if self.mode == "backward":
                self._close(time.time())

    def _close(self, end: float) -> None:
        if self.anchor_pending:  # attached mid-step: step 0 starts here
            self.anchor_pending = False
            self._activity = False
            self.backwards = self.closure_backwards = 0
            self.step_start = end
            if self.on_anchor is not None:
                try:
                    self.on_anchor(end)
                except Exception:  # noqa: BLE001 - never into the training step
                    pass
            return
        step, start = self.step, self.step_start
        self._activity = False
        self.closed_backwards = (self.backwards, self.closure_backwards)
        self.backwards = self.closure_backwards = 0
        self.step += 1
        self.step_start = end
        try:
            self._on_close(step, start, end)
        except Exception as exc:  # the recorder must never break the training step
            self.close_errors += 1
            report = self.on_close_error
            if report is not None:
                try:
                    report(step, exc)
                except Exception:  # noqa: BLE001 - counted in close_errors; nothing else can be done
                    pass


def _any_optimizer_alive() -> bool:
    """Whether the script has built an optimizer (asked once, at the first backward)."""
    # Fast path: Optimizer.__init__ wraps its class's step() once and marks it ``hooked``.
    if any(getattr(getattr(cls, "step", None), "hooked", False) for cls in _subclasses(torch.optim.Optimizer)):
        return True
    # Otherwise the objects that refer to an optimizer class (instances do), only for scripts
    # without one. gc.get_referrers, not gc.get_objects: a list of every object would keep, for
    # the scan, objects other threads are dropping (an sqlite3 cursor that must be gone before
    # its connection commits). type() rather than isinstance(): isinstance falls back to
    # ``o.__class__``, which some lazy module proxies answer with a deprecation warning.
    optimizer = torch.optim.Optimizer
    classes = [optimizer, *_subclasses(optimizer)]
    refs = gc.get_referrers(*classes)
    try:
        return any(issubclass(type(o), optimizer) for o in refs)
    finally:
        refs.clear()


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    todo: list[type] = [cls]
    while todo:
        sub: type
        for sub in todo.pop().__subclasses__():
            out.append(sub)
            todo.append(sub)
    return out

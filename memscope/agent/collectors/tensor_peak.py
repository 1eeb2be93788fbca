"""The exact peak of live tensor bytes in a step (:class:`TensorPeak`): what ``memscope whatif``
measures on every step (the ``tensor_peak`` option), and a plain run on one step after warm-up
(memscope.agent.collectors.peak_step)."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import torch

from memscope.agent.torchcompat.compiled import is_compiling, runtime_only
from memscope.agent.torchcompat.storages import storages
from memscope.agent.torchcompat.unseen import unseen


def dispatch_mode_on_top() -> Any:
    """The TorchDispatchMode on top of this thread's mode stack (None: none is active)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


class TensorPeak:
    """The exact peak of live tensor bytes in one step, on any device: the CPU counterpart of
    the CUDA allocator's ``max_memory_allocated`` (without its rounding), for what-if runs.

    At the step's start, every storage of a tensor Python can reach (a gc walk, plus each
    parameter's ``.grad``) is counted; during the step, a TorchDispatchMode counts every storage
    an op returns that is not counted yet. Each counted storage carries a weakref whose callback
    subtracts it when the storage dies (storage Python objects are preserved while the storage
    lives, so the weakref dies with the memory). It costs a Python call per op and a gc walk per
    step: what-if trials only (``tensor_peak`` option). Not seen: memory that is not a tensor
    storage, and tensors reachable only from C++ at the step's start (a graph kept from an
    earlier step). A sparse tensor counts its indices' and values' storages; a meta tensor holds
    nothing; a tensor whose storage cannot be read is counted in ``uncounted`` (the event says so).
    ``grads_at_peak``: bytes of the parameters' ``.grad`` counted at the step's start still live
    at its peak (0 when the script freed them before: ``zero_grad()`` ahead of the forward);
    gradient accumulation keeps them live through every micro-batch.
    ``phase_peaks``: per phase, the highest total reached in it and the total when the stretch of
    that phase holding it began (its first new storage): a step's backward and its optimizer
    step peak apart, and a technique that lowers one lowers the step's peak only down to the
    other (memscope.analysis.suggestions.step_peaks)."""

    def __init__(self, outside_compile: bool = False, phase: Callable[[], str] | None = None) -> None:
        # outside_compile: the caller does not start measuring under compile (the plain run's
        # one step), so the mode opts out of torch's _disable_dynamo wrap of __torch_dispatch__,
        # which imports torch._dynamo at the first op (a second or more of CPU, into a process
        # that may never compile) and switches frame evaluation on every op. Should the script
        # compile during the step, Dynamo inlines __torch_dispatch__: is_compiling() makes it
        # the bare op there (the compiled graph's ops still come through the mode when they run)
        self.outside_compile = outside_compile
        # the step's phase (forward, backward, optimizer, other) when the peak was reached: where
        # a technique acts (Adam's step temporaries, which SGD does not make); None: not known
        self._phase = phase
        self.phase_at_peak: str | None = None
        self.step: int | None = None
        self.live: dict[int, int] = {}
        self.total = 0
        self.peak = 0
        self.start = 0
        self.active = False
        self.uncounted = 0  # tensors seen whose memory could not be read (no storage)
        self._grads: set[int] = set()  # keys of the .grad storages counted at the step's start
        self.grads_live = 0  # their bytes still live
        self.grads_at_peak = 0  # grads_live when the peak was reached
        self.phase_peaks: dict[str, tuple[int, int]] = {}  # phase -> (its peak, its stretch's start)
        self._stretch: tuple[str | None, int] = (None, 0)  # the phase of the last new storage, and
        # the total when that phase's stretch began
        self._closure = False  # the optimizer's step ran a forward and backward (see add)
        self._refs: set[weakref.ReferenceType[Any]] = set()
        self._lock = threading.RLock()  # a callback can fire inside add() on the same thread
        self._mode: Any = None
        self.stuck: Any = None  # a mode left on the stack under the program's own (see leave)
        self._thread: int | None = None

    @runtime_only  # its mode's __torch_dispatch__ runs inside a compiled graph's ops: never compiled
    def begin(self, step: int, tensors: Callable[[], list[Any] | None] | None = None) -> None:
        """Count what is live and start counting what the step's ops make. ``tensors``: every
        live tensor with a Python object (the agent's registry of live tensors, a list the
        caller may keep: it is cleared here), or None: a gc walk finds them (25 ms after a bare
        ``import torch``, 100 ms in a process with memscope's agent and its imports)."""
        import gc

        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class _Mode(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                return not tracker.outside_compile

            @classmethod
            def ignore_compile_internals(cls) -> bool:
                # a script that compiles while the plain run's step is measured: Dynamo turns
                # the mode off while it compiles (else it refuses to, and fullgraph=True fails)
                return tracker.outside_compile

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                if is_compiling():
                    return out
                if tracker.active:
                    tracker.add_tree(out)
                return out

        with self._lock:
            self.step = step
            self.live, self._refs = {}, set()
            self.total = self.peak = self.uncounted = 0
            self._grads, self.grads_live, self.grads_at_peak = set(), 0, 0
            self.phase_at_peak = None
        found = tensors() if tensors is not None else None
        # type(), never isinstance: isinstance asks __class__, and a deprecated module attribute
        # (torch.distributed.reduce_op) warns when asked. Not warnings.catch_warnings(): leaving
        # it resets every module's once-per-location warning registry, so a warning the script
        # had already shown printed again (twice under attach)
        tensor, parameter = torch.Tensor, torch.nn.Parameter
        try:
            for obj in found if found is not None else gc.get_objects():
                kind = type(obj)
                if kind is tensor or issubclass(kind, tensor):
                    self.add(obj)
                    if issubclass(kind, parameter) and obj.grad is not None:
                        self._add_grad(obj.grad)
        finally:
            if found is not None:
                found.clear()  # strong references to the program's tensors
        self.start = self.total
        self.grads_at_peak = self.grads_live
        self.phase_peaks, self._stretch, self._closure = {}, (None, 0), False  # the step's own ops only
        self.active = True
        self._mode = _Mode()
        self._mode.__enter__()
        self._thread = threading.get_ident()

    def end(self) -> tuple[int, int]:
        """Stop counting and leave the mode; (peak, start) bytes of the step."""
        self.active = False
        self.leave()
        self._mode = None  # on another thread it stays pushed there, inactive
        with self._lock:
            peak, start = self.peak, self.start
            self._refs = set()  # dropping the weakrefs drops their callbacks
            self.live = {}
        return peak, start

    def leave(self) -> bool:
        """Pop the mode off this thread's stack when it is on top; True when it is off the stack
        (or never was). A mode the program entered after ours and still holds is on top: popping
        would take the program's mode away; ours stays there, inactive (a pass-through), and
        ``stuck`` keeps it for a later try."""
        mode = self._mode if self._mode is not None else self.stuck
        if mode is None:
            return True
        try:
            if self._thread != threading.get_ident() or dispatch_mode_on_top() is not mode:
                self.stuck = mode
                return False
            mode.__exit__(None, None, None)
        except Exception:
            pass
        self.stuck = None
        return True

    @unseen
    def _add_grad(self, g: Any) -> None:
        """A parameter's .grad at the step's start: counted, and its storages kept as grads."""
        self.add(g)
        try:
            parts = storages(g)
        except Exception:
            return
        with self._lock:
            for st, nbytes in parts:
                if id(st) in self.live and id(st) not in self._grads:
                    self._grads.add(id(st))
                    self.grads_live += nbytes

    def add_tree(self, obj: Any, depth: int = 0) -> None:
        if isinstance(obj, torch.Tensor):
            self.add(obj)
        elif depth < 3 and isinstance(obj, (tuple, list)):
            for o in obj:
                self.add_tree(o, depth + 1)

    @unseen  # storage and device reads of the program's tensors: not seen by its subclasses
    def add(self, t: Any) -> None:
        try:
            parts = storages(t)  # sparse: its indices' and values' storages; meta: none (no memory)
        except Exception:
            self.uncounted += 1  # a tensor subclass without storage, say: said in the event
            return
        for st, nbytes in parts:
            key = id(st)
            if key in self.live:
                continue
            with self._lock:
                if key in self.live:
                    continue
                phase = self._phase_now()
                # (the walk of what is live at the step's start is no phase's)
                if self.active and phase is not None and phase != self._stretch[0]:
                    # a backward straight after the optimizer's step began: a closure it evaluates
                    # (LBFGS, Lightning), whose forward ran in the optimizer's step
                    self._closure = self._closure or (self._stretch[0] == "optimizer" and phase == "backward")
                    self._stretch = (phase, self.total)
                self.live[key] = nbytes
                self.total += nbytes
                if self.active and phase is not None and self.total > self.phase_peaks.get(phase, (-1, 0))[0]:
                    self.phase_peaks[phase] = (self.total, self._stretch[1])
                if self.total > self.peak:
                    self.peak = self.total
                    self.grads_at_peak = self.grads_live
                    self.phase_at_peak = phase
                self._refs.add(weakref.ref(st, self._released(key)))

    def _phase_now(self) -> str | None:
        if self._phase is None:
            return None
        try:
            return self._phase()
        except Exception:
            return None

    def phases(self) -> dict[str, dict[str, int]]:
        """The ``tensor_peak`` event's ``phases``: phase -> {peak_bytes, start_bytes}; empty where
        the optimizer's step evaluated a closure (its peak is the model's too: not two sides)."""
        with self._lock:
            if self._closure:
                return {}
            return {p: {"peak_bytes": high, "start_bytes": start} for p, (high, start) in self.phase_peaks.items()}

    def _released(self, key: int) -> Callable[[Any], None]:
        def callback(ref: Any) -> None:
            try:
                with self._lock:
                    self._refs.discard(ref)
                    n = self.live.pop(key, None)
                    if n is not None:
                        self.total -= n
                        if key in self._grads:
                            self._grads.discard(key)
                            self.grads_live -= n
            except Exception:
                pass
        return callback

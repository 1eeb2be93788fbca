"""The layer profiler: one profiled step's per-module rows, from its parts.

:class:`LayerProfiler` keeps, per thread, a stack of the modules whose ``forward`` is running
(its pre / post hooks, installed by :mod:`.hooks`), times each counted call, counts its calls and
the bytes of its outputs, and says which module saved each tensor :mod:`.saved` counts: the
module on top of the stack, or the first module of a checkpoint region for the inputs
checkpointing keeps. Saved tensors packed outside every module go to ``NO_MODULE``. Forward calls
made during backward (checkpoint recomputation) or with grad disabled (evaluation) are not
counted. The other parts: micro-batches (:mod:`.micro`), backward time (:mod:`.backward`), names
(:mod:`.names`), the memory breakdown (:mod:`.breakdown`).

On CUDA (only once the script initialised it), each counted call also reads the allocator's
``allocated`` bytes before and after, and its peak counter (never reset: resetting it would change
the script's own ``max_memory_allocated``): ``alloc_delta`` is after minus before, ``alloc_peak``
the highest allocated inside minus before, known only when the peak counter rose during the call
(otherwise None: an earlier, higher peak hides it).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from memscope.agent.collectors.layers.backward import BackwardTimer
from memscope.agent.collectors.layers.breakdown import breakdown
from memscope.agent.collectors.layers.hooks import ModuleHooks
from memscope.agent.collectors.layers.micro import MicroBatches
from memscope.agent.collectors.layers.names import ModelNames
from memscope.agent.collectors.layers.saved import SavedTensors, StorageKey
from memscope.agent.collectors.layers.stats import ModuleStats, merge_rows
from memscope.agent.collectors.layers.tensors import (
    cuda_alloc,
    cuda_ready,
    graph_task_id,
    storage_key,
    tensor_tree_bytes,
    tensors,
)
from memscope.agent.torchcompat.checkpoint_regions import (
    NON_REENTRANT,
    REENTRANT,
    non_reentrant_region,
    reentrant_region,
)
from memscope.agent.torchcompat.compiled import is_compiler_module, is_compiling, runtime_only
from memscope.agent.torchcompat.unseen import unseen

_MAX_RECENT = 64  # packs remembered between two module events (a checkpoint's inputs)

# A frame of a thread's module stack: [module, id(root), start time, counted, CUDA allocated
# before, CUDA peak before, checkpoint region or None, pushed during backward]
_MODULE, _ROOT, _START, _COUNTED, _ALLOC, _PEAK, _REGION, _IN_BACKWARD = range(8)


class LayerProfiler:
    """One profiled step's accounting. ``begin`` and ``end`` run on the training thread."""

    def __init__(self, in_optimizer: Callable[[], bool] | None = None) -> None:
        self.active = False
        self.cut_short = False  # the rest of the step runs unprofiled (:meth:`cut`)
        self.step: int | None = None
        self.saved_hooks_error: str | None = None
        self._local = threading.local()
        self._cuda = False  # read the allocator around each counted call
        self._micro = MicroBatches(in_optimizer or (lambda: False))
        self._names = ModelNames()
        self._saved = SavedTensors(self._is_active, self._charge, self._micro.backward_seen, self._kernel)
        self._backward = BackwardTimer(self._is_active, self._micro.backward_seen)
        self._hooks = ModuleHooks(self._pre, self._post, self._names.models, self._is_active)

    def _is_active(self) -> bool:
        return self.active and not self.cut_short

    # -- what the agent reads ------------------------------------------------------------------

    @property
    def micro_batches(self) -> int:
        return self._micro.count

    @property
    def closure_forwards(self) -> int:
        return self._micro.closure_forwards

    @property
    def compiled_mode(self) -> bool:
        return self._hooks.compiled_mode

    @property
    def max_live(self) -> int:
        return self._saved.max_live

    @property
    def live_bytes(self) -> int:
        return self._saved.live_bytes

    def saved_alias_ids(self) -> set[int]:
        """ids of the aliases the saved-tensors hook handed autograd that are still saved (for
        the inventory: an alias no Python code holds is graph memory, not a loose tensor)."""
        return self._saved.alias_ids()

    def roots(self) -> list[Any]:
        """The outermost modules seen on profiled steps that are still alive (the models)."""
        return self._names.roots()

    def root_prefix(self, module: Any) -> str:
        return self._names.root_prefix(module)

    def module_name(self, module: Any) -> str | None:
        return self._names.module_name(module)

    def breakdown(self, optimizers: list[Any]) -> dict[str, int]:
        """Parameters, gradients and optimizer state of the roots and optimizers seen, by unique
        storage, and the step's activations at their peak (``max_live``)."""
        return breakdown(self._names.step_models(), optimizers, self._saved.max_live)

    # -- life cycle ----------------------------------------------------------------------------

    def begin(self, step: int) -> None:
        self.step = step
        self.cut_short = False
        self._micro.reset()
        self._names.new_step()
        self._saved.reset()
        self._local = threading.local()
        self.saved_hooks_error = None
        self._backward.reset()
        self._cuda = cuda_ready()
        self.active = True
        self._hooks.install()
        self.saved_hooks_error = self._saved.install()

    def cut(self) -> None:
        """Stop profiling the rest of the step (memscope.agent.collectors.measure_budget: a
        closure the optimizer evaluates again): every hook off now, on the training thread at
        the end of a backward; :meth:`end` gives the rows of the micro-batches profiled."""
        self.cut_short = True
        self._hooks.remove()
        self._backward.remove()
        self._saved.remove_if_top()

    def count_unprofiled(self, micro_batches: int, closure_forwards: int) -> None:
        """Micro-batches of the step that ran after :meth:`cut` (counted by the step tracker)."""
        self._micro.count += micro_batches
        self._micro.closure_forwards += closure_forwards

    def end(self) -> list[ModuleStats]:
        """Remove every hook and return the step's per-module rows (most saved bytes first)."""
        self.active = False
        self._hooks.remove()
        self._backward.remove()
        self._saved.remove()
        self._backward.add_times()
        stats, no_module = self._micro.finish()
        rows = self._names.name(stats)
        if no_module.saved_tensors:
            rows.append(no_module)
        rows = merge_rows(rows)
        self._saved.forget()
        self._local = threading.local()
        return rows

    # -- module hooks --------------------------------------------------------------------------

    def _thread(self) -> Any:
        """This thread's state: ``stack`` of running module frames, ``recent`` packs since the
        last module event (non-reentrant checkpoint inputs), ``pending`` inputs a reentrant
        checkpoint region is about to save."""
        local = self._local
        if getattr(local, "stack", None) is None:
            local.stack = []
            local.recent = []
            local.pending = None
        return local

    @unseen
    @runtime_only
    def _pre(self, module: Any, args: Any) -> None:
        if is_compiling() or not self.active:
            return  # Dynamo traces this as nothing
        if is_compiler_module(module):
            return  # a compiled region's own graph module: part of its caller
        try:
            local = self._thread()
            stack = local.stack
            # not counted: evaluation without grad, and recomputation inside backward
            # (activation checkpointing); such calls still keep the stack paired
            grad = torch.is_grad_enabled()
            in_backward = grad and graph_task_id() >= 0
            counted = grad and not in_backward
            if counted and stack and stack[-1][_IN_BACKWARD]:
                _drop_backward_frames(stack)
            if stack and stack[0][_MODULE] is module:
                # the model called again while "running": its previous forward raised (no
                # post hook ran) and the script caught it; start over
                del stack[:]
            parent = stack[-1] if stack else None
            region = parent[_REGION] if parent is not None else None  # checkpoint region, if any
            first = False  # the first module of a checkpoint region under its caller
            if counted:
                counted = parent is None or parent[_COUNTED]
                if counted and self._saved.installed:
                    found = non_reentrant_region()
                    if found is not None and found != region:
                        region, first = found, True
            elif parent is not None and parent[_COUNTED] and region is not None \
                    and region[0] == REENTRANT:
                counted = True  # inside a reentrant checkpoint's forward (its own no_grad)
            elif not grad and (parent is None or (parent[_COUNTED] and region is None)) \
                    and graph_task_id() < 0:
                found = reentrant_region()  # a no-grad call under a counted caller: checkpoint?
                if found is not None:
                    counted, region, first = True, found, True
            root_id = parent[_ROOT] if parent is not None else id(module)
            if parent is None and counted:
                self._micro.root_forward()
                if root_id not in self._names.step_roots:
                    self._names.see_root(module)
                    self._saved.add_model(module)
            if first and region is not None:
                self._checkpoint_inputs(local, region, args, self._micro.module_stats(module, root_id))
            elif counted and region is None:
                local.pending = None
            if local.recent:
                local.recent = []
            before = peak = None
            if counted and self._cuda:
                before, peak = cuda_alloc()
            stack.append([module, root_id, time.perf_counter(), counted, before, peak, region,
                          in_backward])
        except Exception:
            pass

    @unseen
    @runtime_only
    def _post(self, module: Any, args: Any, output: Any) -> None:
        if is_compiling() or not self.active:
            return
        try:
            local = self._thread()
            if local.recent:
                local.recent = []
            stack = local.stack
            # find the module's frame (a forward that raised may have left frames above it)
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][_MODULE] is module:
                    break
            else:
                return
            frame = stack[i]
            del stack[i:]
            if not frame[_COUNTED]:
                return
            st = self._micro.module_stats(module, frame[_ROOT])
            st.calls += 1
            st.forward_s += time.perf_counter() - frame[_START]
            st.output_bytes += tensor_tree_bytes(output)
            if frame[_ALLOC] is not None:
                _cuda_call(st, frame[_ALLOC], frame[_PEAK])
            if torch.is_grad_enabled():
                self._backward.hook(st, args, output)
        except Exception:
            pass

    def _checkpoint_inputs(self, local: Any, region: tuple[str, int], args: Any,
                           st: ModuleStats) -> None:
        """The first module of a checkpoint region: the region's inputs that checkpointing
        keeps are this module's saving. Non-reentrant checkpointing saved them just before
        (charged to the caller: move them); reentrant checkpointing saves them when its forward
        returns (``pending``: _charge charges them here)."""
        keys = set()
        for t in tensors(args):
            try:
                keys.add(storage_key(t))
            except Exception:
                pass
        if region[0] == NON_REENTRANT:
            for key, owner, nbytes in local.recent:
                if key in keys and owner is not st:
                    owner.saved_bytes -= nbytes
                    owner.saved_tensors -= 1
                    st.saved_bytes += nbytes
                    st.saved_tensors += 1
            return
        pending = local.pending
        if pending is None or pending[0] != region:
            pending = local.pending = (region, {})
        for key in keys:
            pending[1].setdefault(key, st)

    # -- saved tensors -------------------------------------------------------------------------

    def _charge(self, key: StorageKey, nbytes: int) -> None:
        """A storage autograd saves, first seen: charge it to the module that saved it (called
        from the pack hook, under its ``unseen``)."""
        local = self._thread()
        stack = local.stack
        if stack and stack[-1][_IN_BACKWARD] and graph_task_id() < 0:
            _drop_backward_frames(stack)
        if stack and not stack[-1][_COUNTED]:
            # a forward that is not counted saves only when it is a recomputation inside
            # backward (reentrant checkpointing): alive for a moment, not a forward's saving
            return
        if not stack and self._micro.bw_seen and graph_task_id() < 0:
            self._micro.next()  # saved outside modules after a backward: the next micro-batch
        pending = local.pending
        st = pending[1].pop(key, None) if pending is not None else None
        if st is not None:
            pass  # an input a reentrant checkpoint region keeps: its first module's
        elif stack:
            frame = stack[-1]
            st = self._micro.module_stats(frame[_MODULE], frame[_ROOT])
        else:
            st = self._micro.no_module
        st.saved_bytes += nbytes
        st.saved_tensors += 1
        if len(local.recent) < _MAX_RECENT:
            local.recent.append((key, st, nbytes))


    def _kernel(self, kernel: str) -> None:
        """A tensor saved by a scaled_dot_product_attention kernel: the module whose forward is
        running called it (a recomputation inside backward is not a forward's call)."""
        stack = self._thread().stack
        if stack and (not stack[-1][_COUNTED] or stack[-1][_IN_BACKWARD]):
            return
        if not stack and graph_task_id() >= 0:
            return  # saved by a recomputation inside backward, outside every module
        st = self._micro.module_stats(stack[-1][_MODULE], stack[-1][_ROOT]) if stack else self._micro.no_module
        st.kernels = st.kernels or {}
        st.kernels[kernel] = st.kernels.get(kernel, 0) + 1


def _cuda_call(st: ModuleStats, before: int, peak_before: int) -> None:
    after, peak_after = cuda_alloc()
    st.alloc_delta = (st.alloc_delta or 0) + after - before
    # The peak counter is process-wide and never reset here (the script's own
    # max_memory_allocated must stay true): it tells this call's peak only when it rose during
    # the call. Otherwise the peak is unknown and stays None: the higher of before and after
    # (what was kept until a GPU run showed it) read as a peak of 64 KiB for a module whose
    # 64 MiB temporary an earlier step had already counted.
    if peak_after > peak_before:
        st.alloc_peak = max(st.alloc_peak or 0, peak_after - before)


def _drop_backward_frames(stack: list[list[Any]]) -> None:
    """Outside backward, frames pushed during one are stale: a non-reentrant checkpoint stops
    its recomputation early by raising, so those forwards never reach their post hooks."""
    while stack and stack[-1][_IN_BACKWARD]:
        stack.pop()

"""Per-layer activation accounting, on profiled steps only.

While a profiled step runs, a :class:`LayerProfiler` has

* global module forward pre/post hooks that keep, per thread, a stack of the modules whose
  ``forward`` is running (and time each call, count its calls and the bytes of its outputs);
* a ``torch.autograd.graph.saved_tensors_hooks`` pair entered on the training thread. Its pack
  hook charges every tensor autograd saves for backward to the module on top of the stack,
  deduplicated by storage (a storage already saved and still alive counts once, for its first
  saver). Storages of the parameters and buffers of the models seen are not activations.

The pack hook returns a detached alias of its argument (same storage and version counter, no
``grad_fn``: returning the tensor itself would tie an output saved by its own grad_fn into a
reference cycle gc cannot see, so a graph the script keeps could never be freed) and keeps only
a weak reference to that alias: the reference dies when autograd frees the saved tensor, which
also gives the live saved bytes
(``max_live``, the activations at their peak in the step). Between profiled steps every hook is
removed, so PyTorch's no-hook fast path returns.

A module called with an empty stack is a *root*. Names are those of the root's outermost
container (memscope.agent.torchcompat.module_names: the model the user built, also when a framework calls a
submodule first, ``net.0`` under Lightning; wrappers such as ``torch.compile``'s
``OptimizedModule`` and DDP take the name of what they wrap). The first such model's names are
plain (the model itself is ``""``); later distinct models (a loss module called on its own, say)
are prefixed with their class name and ``":"`` (``"CrossEntropyLoss:"``). Saved tensors packed
outside every module go to ``NO_MODULE``. Forward calls made during backward (checkpoint
recomputation) or with grad disabled (evaluation) are not counted.

``torch.compile`` (memscope.agent.torchcompat.compiled): the module hooks are out of Dynamo's sight while it
compiles (``shield``: so it never guards on them, and adding or removing them never
recompiles), and every hook returns at once if Dynamo traces it anyway, so it inlines as
nothing (no graph break, no failure under ``fullgraph=True``). Modules inside a compiled
region are not called at run time, so its saved tensors, time and outputs are charged to the
module that called the compiled code: the ``OptimizedModule`` itself, named as the module it
wraps. Global module hooks make ``OptimizedModule.__call__`` warn, so while a compiled module
exists (or from the moment ``torch.compile(module)`` builds one during a profiled step) the
profiler hooks the modules of the models one by one instead (picklable, inert when pickled),
outside compiled regions: the models holding the compiled modules and those seen before. Graph
modules the compiler made are never rows. The saved-tensors hooks are never traced (Dynamo
disables them while tracing, and their guard ignores hooks that are not graph modules).

Backward time per module (``backward_s``) without global full backward hooks (they wrap every
module's inputs and outputs in ``BackwardHookFunction`` and change the graph): at forward-post of
a counted call, a pre-hook goes on the ``grad_fn`` of each output tensor (the gradient for the
module's output has arrived: its backward starts) and on the ``grad_fn`` of each input tensor
(the gradient for its input is ready: its backward is over). When no input has a ``grad_fn``
(the first layer, data inputs), the end is the end of that backward pass (an autograd engine
callback queued from the start hook). So ``backward_s`` covers the module's children, like
``forward_s``, and autograd work interleaved in that window (another branch scheduled between
them) too. Hooks sit on graph nodes, hold no tensor or node, and their handles are removed at the
end of the step; a backward that runs after that (a graph kept across steps) is not timed.

On CUDA (only once the script initialised it), each counted call also reads the allocator's
``allocated`` bytes before and after, and its peak counter (never reset: resetting it would change
the script's own ``max_memory_allocated``): ``alloc_delta`` is after minus before, ``alloc_peak``
the highest allocated inside minus before, when the peak counter rose during the call (otherwise
the higher of before and after).
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.nn.modules import module as _nn_module

from memscope.agent.torchcompat.checkpoint_regions import (
    NON_REENTRANT,
    REENTRANT,
    non_reentrant_region,
    reentrant_region,
)
from memscope.agent.torchcompat.compiled import (
    CompileWatch,
    is_compiler_module,
    is_compiling,
    optimized_modules,
    runtime_only,
    shield,
)
from memscope.agent.torchcompat.module_names import dotted_names, outermost
from memscope.agent.torchcompat.optimizer_state import optimizer_state_tensors
from memscope.agent.torchcompat.unseen import unseen

NO_MODULE = "<no module>"


@dataclass
class ModuleStats:
    name: str
    type: str
    calls: int = 0
    saved_bytes: int = 0
    saved_tensors: int = 0
    output_bytes: int = 0
    forward_s: float = 0.0
    backward_s: float | None = None  # None: no backward of a counted call ran in the step
    alloc_delta: int | None = None  # CUDA only
    alloc_peak: int | None = None  # CUDA only


@dataclass
class _Root:
    ref: weakref.ReferenceType[Any]  # a module called with an empty stack
    top: weakref.ReferenceType[Any] | None = None  # its outermost container, once resolved
    prefix: str = ""


class _Micro:
    """One micro-batch's per-module stats (or, for ``_others``, each module's largest)."""

    def __init__(self, stats: dict[tuple[int, int], ModuleStats] | None = None,
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


@dataclass
class _Top:
    ref: weakref.ReferenceType[Any]
    prefix: str  # "" for the first model, "CrossEntropyLoss:" for a later distinct one
    names: dict[int, str] = field(default_factory=dict)


def _graph_task_id() -> int:
    try:
        return int(torch._C._current_graph_task_id())
    except Exception:
        return -1


def tensor_tree_bytes(obj: Any, depth: int = 0) -> int:
    """Bytes of the tensors in ``obj`` (a tensor, or tuples / lists / dicts of them)."""
    if isinstance(obj, torch.Tensor):
        try:
            return obj.numel() * obj.element_size()
        except Exception:
            return 0
    if depth > 4:
        return 0
    if isinstance(obj, (tuple, list)):
        return sum(tensor_tree_bytes(o, depth + 1) for o in obj)
    if isinstance(obj, dict):
        return sum(tensor_tree_bytes(o, depth + 1) for o in obj.values())
    return 0


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return hash(t.device), s.data_ptr()


class LayerProfiler:
    """One profiled step's accounting. ``begin`` and ``end`` run on the training thread."""

    def __init__(self, in_optimizer: Callable[[], bool] | None = None) -> None:
        self.active = False
        self.step: int | None = None
        # whether the training thread is inside optimizer.step() (the agent's phase): forwards
        # there are a closure's evaluations (LBFGS), not micro-batches the script accumulates
        self._in_optimizer = in_optimizer or (lambda: False)
        self.closure_forwards = 0  # micro-batches of the step that began inside optimizer.step()
        self._micro_open = False  # the micro-batch in progress has had its first forward
        self._handles: list[Any] = []
        self._saved_ctx: Any = None
        self._saved_thread: int | None = None
        self.saved_hooks_error: str | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._roots: dict[int, _Root] = {}  # id(root) -> names, kept across steps
        self._step_roots: set[int] = set()
        self._param_keys: set[tuple[int, int]] = set()
        self._stats: dict[tuple[int, int], ModuleStats] = {}  # (id(root), id(module))
        self._no_module = ModuleStats(NO_MODULE, "")
        # micro-batches: a forward after a backward starts the next one; the rows are those of
        # the micro-batch that saved the most (see _fold_micro)
        self.micro_batches = 1
        self._bw_seen = False  # a backward ran since the micro-batch in progress began
        self._best = _Micro()  # the finished micro-batch that saved the most so far
        self._best_total = -1
        self._others = _Micro()  # each module's largest in the other micro-batches
        # live saved storages: key -> [alias count, nbytes]; weakrefs keep their callbacks alive
        self._live: dict[tuple[int, int], list[int]] = {}
        self._refs: set[weakref.ReferenceType[Any]] = set()
        self.live_bytes = 0
        self.max_live = 0
        # backward timing: per counted call [stats, start, end]; handles of the node hooks
        self._bw_calls: list[list[Any]] = []
        self._bw_handles: list[Any] = []
        self._bw_nodes: dict[Any, tuple[list[Any], list[Any]]] = {}  # (thread, seq nr) -> calls
        self._cuda = False  # read the allocator around each counted call
        self._tops: dict[int, _Top] = {}  # id(outermost container) -> prefix and names
        # compiled mode: a torch.compile(module) result exists, so hooks go on each module
        self.compiled_mode = False
        self._watch = CompileWatch(self._on_compiled)
        self._global_handles: list[Any] = []
        self._hooked: set[int] = set()  # ids of modules hooked one by one in this step
        shield.add(self._module_hook_handles)  # out of Dynamo's sight while it compiles

    # -- life cycle ----------------------------------------------------------------------------

    def begin(self, step: int) -> None:
        self.step = step
        self._stats = {}
        self._no_module = ModuleStats(NO_MODULE, "")
        self.micro_batches = 1
        self.closure_forwards = 0
        self._micro_open = False
        self._bw_seen = False
        self._best = _Micro()
        self._best_total = -1
        self._others = _Micro()
        self._step_roots = set()
        self._param_keys = set()
        self._live = {}
        self._refs = set()
        self.live_bytes = self.max_live = 0
        self._local = threading.local()
        self.saved_hooks_error = None
        self._bw_calls = []
        self._bw_handles = []
        self._bw_nodes = {}
        self._cuda = _cuda_ready()
        self._hooked = set()
        self.active = True
        compiled = optimized_modules()
        self.compiled_mode = self.compiled_mode or bool(compiled)
        if self.compiled_mode:
            self._hook_each(self._models(compiled))
        else:
            # No always_call: Dynamo tracing a call with an always-called hook guards on that
            # hook's id, and the next step's hook has another: a recompile. A forward that
            # raises leaves its frame on the stack instead (see _pre).
            self._global_handles.append(_nn_module.register_module_forward_pre_hook(self._pre))
            self._global_handles.append(_nn_module.register_module_forward_hook(self._post))
            self._watch.install()  # torch.compile(module) during the step: go per module
        try:
            self._drop_own_stale_hooks()
            if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
                # The script's own hooks (save_on_cpu, say) are active: pushing ours on top
                # would switch theirs off. Count calls and outputs only.
                self.saved_hooks_error = "the script has its own saved-tensors hooks active"
            else:
                ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
                ctx.__enter__()
                self._saved_ctx = ctx
                self._saved_thread = threading.get_ident()
        except Exception as exc:
            self.saved_hooks_error = f"{type(exc).__name__}: {exc}"

    def _drop_own_stale_hooks(self) -> None:
        """Pop our own hooks left on this thread's stack by a step that ended on another thread
        (a loop that moved from a worker thread to the main thread): they are not the script's."""
        for _ in range(8):  # one per profiled step that ended elsewhere, at most; bounded anyway
            top = torch._C._autograd._top_saved_tensors_default_hooks(False)
            if top is None or top[0] != self._pack:
                return
            torch._C._autograd._pop_saved_tensors_default_hooks()

    def end(self) -> list[ModuleStats]:
        """Remove every hook and return the step's per-module rows (most saved bytes first)."""
        self.active = False
        self._watch.remove()
        self._remove_global()
        for h in self._handles:
            try:
                h.remove()
            except Exception:
                pass
        self._handles.clear()
        self._hooked = set()
        for h in self._bw_handles:  # on graph nodes: a graph kept past the step loses them
            try:
                h.remove()
            except Exception:
                pass
        self._bw_handles = []
        self._bw_nodes = {}
        if self._saved_ctx is not None:
            if self._saved_thread == threading.get_ident():
                try:
                    self._saved_ctx.__exit__(None, None, None)
                except Exception:
                    pass
            # else: another thread cannot pop the training thread's hook; ours stays there
            # inactive (the pack hook returns at once when not active)
            self._saved_ctx = None
            self._saved_thread = None
        self._sum_backward()
        self._fold_micro()
        best, others = self._best, self._others
        self._stats = {**others.stats, **best.stats}
        nm = best.no_module if best.no_module is not None else others.no_module
        self._no_module = nm if nm is not None else ModuleStats(NO_MODULE, "")
        self._best, self._others = _Micro(), _Micro()
        rows = self._resolve()
        self._stats = {}
        self._live = {}
        self._refs = set()  # dropping the weakrefs drops their callbacks
        self._local = threading.local()
        return rows

    def roots(self) -> list[Any]:
        """The outermost modules seen on profiled steps that are still alive (the models)."""
        with self._lock:
            entries = list(self._roots.values())
        return [m for m in (e.ref() for e in entries) if m is not None]

    def root_prefix(self, module: Any) -> str:
        """The name prefix of ``module`` when it is a root seen here ("" for the first model,
        ``"CrossEntropyLoss:"`` for a later distinct root), "" otherwise."""
        with self._lock:
            entry = self._roots.get(id(module))
        return entry.prefix if entry is not None and entry.ref() is module else ""

    def module_name(self, module: Any) -> str | None:
        """The full name of any module as the rows name it (its model's prefix and its dotted
        name in that model); None when that fails. A walk up through gc referrers: for rare
        callers (an OOM post-mortem)."""
        try:
            top, path = outermost(module)
            with self._lock:
                info = self._tops.get(id(top))
                prefix = info.prefix if info is not None and info.ref() is top else ""
            if not prefix:
                return path
            return prefix + path if path else prefix[:-1]
        except Exception:
            return None

    # -- installing hooks ----------------------------------------------------------------------

    def _module_hook_handles(self) -> list[Any]:
        return [*self._global_handles, *self._handles]

    def _remove_global(self) -> None:
        for h in self._global_handles:
            try:
                h.remove()
            except Exception:
                pass
        self._global_handles = []

    def _models(self, compiled: list[Any]) -> list[Any]:
        """Compiled mode: the models to hook module by module: the outermost containers of the
        compiled modules (found through gc referrers) and of the roots seen so far. A module no
        model holds that was never called on a profiled step before (a loss module) is not
        hooked: what it saves is under NO_MODULE."""
        tops: dict[int, Any] = {}
        with self._lock:
            known = [t.ref() for t in self._tops.values()]
            known += [r.ref() for r in self._roots.values()]
        for m in [*compiled, *known]:
            if m is None:
                continue
            try:
                top = outermost(m)[0]
            except Exception:
                top = m
            tops[id(top)] = top
        return list(tops.values())

    def _hook_each(self, tops: list[Any]) -> None:
        """Compiled mode: a pre and a post hook on every module of ``tops`` (not on graph
        modules the compiler made)."""
        pre, post = _PreHook(self), _PostHook(self)
        todo = [t for t in tops if not is_compiler_module(t)]
        while todo:
            m = todo.pop()
            if id(m) in self._hooked:
                continue
            self._hooked.add(id(m))
            compiled_in_place = getattr(m, "_compiled_call_impl", None) is not None
            if not compiled_in_place:  # module.compile(): its hooks would run compiled
                try:
                    self._handles.append(m.register_forward_pre_hook(pre))
                    self._handles.append(m.register_forward_hook(post))
                except Exception:
                    pass
            if compiled_in_place or type(m).__name__ == "OptimizedModule":
                continue  # nothing inside a compiled region runs as a module: no hooks there
            try:
                todo.extend(c for c in m._modules.values()
                            if c is not None and not is_compiler_module(c))
            except Exception:
                pass

    def _on_compiled(self, optimized: Any, wrapped: Any) -> None:
        """``torch.compile(wrapped)`` is building ``optimized`` during a profiled step that has
        global hooks: before it can be called (and warn), swap them for per-module hooks, none
        inside ``wrapped`` (not yet registered in ``optimized``, so still a top of its own).
        The registration hook calling this stays installed (removing it while torch iterates
        over the registration hooks would fail) until the step ends."""
        if not self.active or self.compiled_mode:
            return
        self.compiled_mode = True
        self._remove_global()
        self._hooked.update(id(m) for m in wrapped.modules())
        self._hook_each([optimized, *self._models([wrapped])])

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
            in_backward = grad and _graph_task_id() >= 0
            counted = grad and not in_backward
            if counted and stack and stack[-1][7]:
                _drop_backward_frames(stack)
            if stack and stack[0][0] is module:
                # the model called again while "running": its previous forward raised (no
                # post hook ran) and the script caught it; start over
                del stack[:]
            parent = stack[-1] if stack else None
            region = parent[6] if parent is not None else None  # checkpoint region, if any
            first = False  # the first module of a checkpoint region under its caller
            if counted:
                counted = parent is None or parent[3]
                if counted and self._saved_ctx is not None:
                    found = non_reentrant_region()
                    if found is not None and found != region:
                        region, first = found, True
            elif parent is not None and parent[3] and region is not None and region[0] == REENTRANT:
                counted = True  # inside a reentrant checkpoint's forward (its own no_grad)
            elif not grad and (parent is None or (parent[3] and region is None)) \
                    and _graph_task_id() < 0:
                found = reentrant_region()  # a no-grad call under a counted caller: checkpoint?
                if found is not None:
                    counted, region, first = True, found, True
            root_id = parent[1] if parent is not None else id(module)
            if parent is None and counted:
                if self._bw_seen:
                    self._next_micro()  # a forward after a backward: the next micro-batch
                if not self._micro_open:
                    self._micro_open = True
                    self.closure_forwards += bool(self._in_optimizer())
                if root_id not in self._step_roots:
                    self._see_root(module)
            if first and region is not None:
                self._checkpoint_inputs(local, region, args, self._module_stats(module, root_id))
            elif counted and region is None:
                local.pending = None
            if local.recent:
                local.recent = []
            before = peak = None
            if counted and self._cuda:
                before, peak = _cuda_alloc()
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
                if stack[i][0] is module:
                    break
            else:
                return
            frame = stack[i]
            del stack[i:]
            if not frame[3]:
                return
            st = self._module_stats(module, frame[1])
            st.calls += 1
            st.forward_s += time.perf_counter() - frame[2]
            st.output_bytes += tensor_tree_bytes(output)
            if frame[4] is not None:
                self._cuda_call(st, frame[4], frame[5])
            if torch.is_grad_enabled():
                self._hook_backward(st, args, output)
        except Exception:
            pass

    def _checkpoint_inputs(self, local: Any, region: tuple[str, int], args: Any,
                           st: ModuleStats) -> None:
        """The first module of a checkpoint region: the region's inputs that checkpointing
        keeps are this module's saving. Non-reentrant checkpointing saved them just before
        (charged to the caller: move them); reentrant checkpointing saves them when its forward
        returns (``pending``: _pack charges them here)."""
        keys = set()
        for t in _tensors(args):
            try:
                keys.add(_storage_key(t))
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

    # -- micro-batches -------------------------------------------------------------------------

    @unseen
    @runtime_only
    def _unpack(self, t: Any) -> Any:
        self._bw_seen = True  # a backward is using what was saved
        return t

    def _next_micro(self) -> None:
        self._fold_micro()
        self.micro_batches += 1
        self._bw_seen = False
        self._micro_open = False

    def _fold_micro(self) -> None:
        """End of a micro-batch. The rows are one micro-batch's, never a sum over those of a
        gradient-accumulation step: the one that saved the most (the earliest on a tie), so
        they bound the step's peak as one forward does. A module that did not run in it (a
        second model with a backward of its own) keeps its own largest micro-batch."""
        done = _Micro(self._stats, self._no_module if self._no_module.saved_tensors else None)
        total = sum(st.saved_bytes for st in done.stats.values()) + self._no_module.saved_bytes
        if total > self._best_total:
            done, self._best = self._best, done
            self._best_total = total
        self._others.keep_largest(done)
        self._stats = {}
        self._no_module = ModuleStats(NO_MODULE, "")

    def _cuda_call(self, st: ModuleStats, before: int, peak_before: int) -> None:
        after, peak_after = _cuda_alloc()
        # the peak counter is process-wide and never reset here: it says something about this
        # call only when it rose during it
        inside = peak_after if peak_after > peak_before else max(before, after)
        st.alloc_delta = (st.alloc_delta or 0) + after - before
        st.alloc_peak = max(st.alloc_peak or 0, inside - before)

    # -- backward time -------------------------------------------------------------------------

    @unseen
    def _hook_backward(self, st: ModuleStats, args: Any, output: Any) -> None:
        """Pre-hooks on the grad_fns of the call's outputs (its backward starts) and inputs (it
        ends). One hook per node and step, shared by every call that starts or ends there (a
        module's output node is the next one's input node). Only the nodes in hand are
        touched; nothing keeps them."""
        outs = _grad_fns(output)
        if not outs:
            return
        ins = _grad_fns(args)
        in_ids = {id(n) for n in ins}
        outs = [n for n in outs if id(n) not in in_ids]  # an identity module: nothing of its own
        if not outs or len(self._bw_handles) > MAX_BACKWARD_HOOKS:
            return
        call: list[Any] = [st, None, None, not ins]  # stats, start, end, ends with the pass
        self._bw_calls.append(call)
        for n in outs:
            self._node_calls(n)[0].append(call)
        for n in ins:
            self._node_calls(n)[1].append(call)

    @runtime_only
    def _node_calls(self, node: Any) -> tuple[list[Any], list[Any]]:
        """The (starting, ending) calls of a graph node, hooking it on first sight. Nodes are
        keyed by their sequence number (unique per thread), never by a kept reference."""
        try:
            key: Any = (threading.get_ident(), node._sequence_nr())
        except Exception:
            key = None
        entry = self._bw_nodes.get(key) if key is not None else None
        if entry is None:
            entry = ([], [])
            starts, ends = entry

            def fire(_grads: Any) -> None:
                if not self.active:
                    return
                self._bw_seen = True
                t = time.perf_counter()
                for c in ends:
                    if c[1] is not None and c[2] is None:
                        c[2] = t
                for c in starts:
                    if c[1] is None:
                        c[1] = t
                        if c[3]:  # nothing marks its end but the end of this backward pass
                            self._end_with_pass(c)

            self._bw_handles.append(node.register_prehook(fire))
            if key is not None:
                self._bw_nodes[key] = entry
        return entry

    @runtime_only
    def _end_with_pass(self, call: list[Any]) -> None:
        def ended() -> None:
            if call[2] is None and self.active:
                call[2] = time.perf_counter()
        try:
            torch.autograd.Variable._execution_engine.queue_callback(ended)
        except Exception:
            pass

    def _sum_backward(self) -> None:
        for st, start, end, _ in self._bw_calls:
            if start is not None and end is not None and end >= start:
                st.backward_s = (st.backward_s or 0.0) + (end - start)
        self._bw_calls = []

    def _module_stats(self, module: Any, root_id: int) -> ModuleStats:
        key = (root_id, id(module))
        st = self._stats.get(key)
        if st is None:
            st = self._stats[key] = ModuleStats("", type(module).__name__)
        return st

    def _see_root(self, root: Any) -> None:
        """First sight of a root in this step: remember it (named at the end of the step) and
        its parameter and buffer storages (every profiled step: they can move)."""
        with self._lock:
            rid = id(root)
            entry = self._roots.get(rid)
            if entry is None or entry.ref() is not root:
                self._roots = {k: v for k, v in self._roots.items() if v.ref() is not None}
                self._roots[rid] = _Root(weakref.ref(root))
            self._step_roots.add(rid)
            for t in list(root.parameters()) + list(root.buffers()):
                try:
                    self._param_keys.add(_storage_key(t))
                except Exception:
                    pass

    def _top_of(self, entry: _Root) -> _Top | None:
        """The outermost container of a root, its prefix and its names (found once per root:
        a walk up through gc referrers)."""
        root = entry.ref()
        if root is None:
            return None
        top = entry.top() if entry.top is not None else None
        if top is None:
            top = outermost(root)[0]
            entry.top = weakref.ref(top)
        with self._lock:
            self._tops = {k: v for k, v in self._tops.items() if v.ref() is not None}
            info = self._tops.get(id(top))
            if info is None or info.ref() is not top:
                prefix = "" if not self._tops else _model_class(top) + ":"
                info = self._tops[id(top)] = _Top(weakref.ref(top), prefix)
            entry.prefix = info.prefix
        return info

    # -- saved tensors -------------------------------------------------------------------------

    @unseen
    @runtime_only
    def _pack(self, t: Any) -> Any:
        if not self.active:
            return t
        try:
            key = _storage_key(t)
            if key[1] == 0 or key in self._param_keys:
                return t
            cb = self._released(key)
            # Autograd keeps what the pack hook returns. Returning ``t`` itself would make an
            # output saved by its own grad_fn (relu, exp, ...) hold its graph through its
            # Python object: a reference cycle gc cannot see, so a graph the script keeps
            # (``losses.append(loss)``) could never be freed. A detached alias (same storage
            # and version counter, no grad_fn) has no such cycle; it dies with the graph.
            saved = t.detach()
            ref = weakref.ref(saved, cb)
            with self._lock:
                self._refs.add(ref)
                entry = self._live.get(key)
                if entry is not None:
                    entry[0] += 1
                    return saved
                nbytes = t.untyped_storage().nbytes()
                self._live[key] = [1, nbytes]
                self.live_bytes += nbytes
                if self.live_bytes > self.max_live:
                    self.max_live = self.live_bytes
            local = self._thread()
            stack = local.stack
            if stack and stack[-1][7] and _graph_task_id() < 0:
                _drop_backward_frames(stack)
            if stack and not stack[-1][3]:
                # a forward that is not counted saves only when it is a recomputation inside
                # backward (reentrant checkpointing): alive for a moment, not a forward's saving
                return saved
            if not stack and self._bw_seen and _graph_task_id() < 0:
                self._next_micro()  # saved outside modules after a backward: the next micro-batch
            pending = local.pending
            st = pending[1].pop(key, None) if pending is not None else None
            if st is not None:
                pass  # an input a reentrant checkpoint region keeps: its first module's
            elif stack:
                frame = stack[-1]
                st = self._module_stats(frame[0], frame[1])
            else:
                st = self._no_module
            st.saved_bytes += nbytes
            st.saved_tensors += 1
            if len(local.recent) < _MAX_RECENT:
                local.recent.append((key, st, nbytes))
            return saved
        except Exception:
            pass
        return t

    @runtime_only
    def _released(self, key: tuple[int, int]) -> Callable[[Any], None]:
        def callback(ref: Any) -> None:
            try:
                with self._lock:
                    self._refs.discard(ref)
                    entry = self._live.get(key)
                    if entry is None:
                        return
                    entry[0] -= 1
                    if entry[0] <= 0:
                        del self._live[key]
                        self.live_bytes -= entry[1]
            except Exception:
                pass
        return callback

    # -- names ---------------------------------------------------------------------------------

    def _resolve(self) -> list[ModuleStats]:
        rows: list[ModuleStats] = []
        for rid, root in list(self._roots.items()):  # models get their prefixes in call order
            if rid in self._step_roots:
                try:
                    self._top_of(root)
                except Exception:
                    pass
        for (root_id, mod_id), st in self._stats.items():
            entry = self._roots.get(root_id)
            info = None
            try:
                info = self._top_of(entry) if entry is not None else None
            except Exception:
                info = None
            top = info.ref() if info is not None else None
            name = None
            if info is not None and top is not None:
                name = info.names.get(mod_id)
                if name is None:  # first time, or a module added since: (re)compute once
                    try:
                        info.names = dotted_names(top)
                    except Exception:
                        info.names = {}
                    name = info.names.get(mod_id)
                if name is not None and info.prefix:
                    name = info.prefix + name if name else info.prefix[:-1]
            st.name = name if name is not None else f"<{st.type}>"
            rows.append(st)
        if self._no_module.saved_tensors:
            rows.append(self._no_module)
        # one row per name (a module reached through two roots, say)
        merged: dict[str, ModuleStats] = {}
        for st in rows:
            m = merged.get(st.name)
            if m is None:
                merged[st.name] = st
            else:
                m.calls += st.calls
                m.saved_bytes += st.saved_bytes
                m.saved_tensors += st.saved_tensors
                m.output_bytes += st.output_bytes
                m.forward_s += st.forward_s
                if st.backward_s is not None:
                    m.backward_s = (m.backward_s or 0.0) + st.backward_s
                if st.alloc_delta is not None:
                    m.alloc_delta = (m.alloc_delta or 0) + st.alloc_delta
                    m.alloc_peak = max(m.alloc_peak or 0, st.alloc_peak or 0)
        return sorted(merged.values(), key=lambda s: (-s.saved_bytes, s.name))

    def breakdown(self, optimizers: list[Any]) -> dict[str, int]:
        """Parameters, gradients and optimizer state of the roots and optimizers seen, by unique
        storage, and the step's activations at their peak (``max_live``)."""
        seen: set[tuple[int, int]] = set()

        def add(t: Any) -> int:
            if not isinstance(t, torch.Tensor):
                return 0
            try:
                key = _storage_key(t)
                if key[1] == 0 or key in seen:
                    return 0
                seen.add(key)
                return int(t.untyped_storage().nbytes())
            except Exception:
                return 0

        params: list[Any] = []
        for rid in self._step_roots:
            entry = self._roots.get(rid)
            root = entry.ref() if entry is not None else None
            if root is not None:
                params.extend(root.parameters())
        for opt in optimizers:
            for group in getattr(opt, "param_groups", []):
                params.extend(group.get("params", []))
        out = {"parameters": sum(add(p) for p in params),
               "gradients": sum(add(getattr(p, "grad", None)) for p in params),
               "optimizer_state": 0, "activations": int(self.max_live)}
        out["optimizer_state"] = sum(add(v) for v in optimizer_state_tensors(optimizers))
        return out


def _model_class(top: Any) -> str:
    """The class name a later distinct model's rows are prefixed with (a wrapper's: what it wraps)."""
    from memscope.agent.torchcompat.module_names import wrapped_child

    seen = 0
    while seen < 4:
        hidden = wrapped_child(top)
        if hidden is None:
            break
        top = top._modules[hidden]
        seen += 1
    return type(top).__name__


class _PreHook:
    """A per-module forward pre-hook (compiled mode). It holds the profiler weakly, and a model
    pickled whole during a profiled step (torch.save(model), copy.deepcopy) carries an inert
    copy instead of failing on the profiler's locks."""

    def __init__(self, profiler: LayerProfiler) -> None:
        self._profiler: Any = weakref.ref(profiler)

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._profiler = _nothing

    @runtime_only
    def __call__(self, module: Any, args: Any) -> None:
        if is_compiling():
            return None  # Dynamo traces this as nothing
        profiler = self._profiler()
        if profiler is not None:
            profiler._pre(module, args)
        return None


class _PostHook(_PreHook):
    @runtime_only
    def __call__(self, module: Any, args: Any, output: Any) -> None:  # type: ignore[override]
        if is_compiling():
            return None
        profiler = self._profiler()
        if profiler is not None:
            profiler._post(module, args, output)
        return None


def _nothing() -> None:
    return None


MAX_BACKWARD_HOOKS = 100_000  # node hooks per profiled step; calls beyond it are not timed
_MAX_RECENT = 64  # packs remembered between two module events (a checkpoint's inputs)


def _drop_backward_frames(stack: list[list[Any]]) -> None:
    """Outside backward, frames pushed during one are stale: a non-reentrant checkpoint stops
    its recomputation early by raising, so those forwards never reach their post hooks."""
    while stack and stack[-1][7]:
        stack.pop()


def _tensors(obj: Any, depth: int = 0) -> list[Any]:
    """The tensors in ``obj`` (tuples / lists / dicts, bounded)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    out: list[Any] = []
    if depth < 3 and isinstance(obj, (tuple, list)):
        for o in obj[:16]:
            out.extend(_tensors(o, depth + 1))
    elif depth < 3 and isinstance(obj, dict):
        for o in list(obj.values())[:16]:
            out.extend(_tensors(o, depth + 1))
    return out


def _grad_fns(obj: Any, depth: int = 0, limit: int = 16) -> list[Any]:
    """Distinct grad_fns of the tensors in ``obj`` (tuples / lists / dicts, bounded)."""
    if isinstance(obj, torch.Tensor):  # the common cases first: one tensor, a 1-tuple
        fn = obj.grad_fn
        return [fn] if fn is not None else []
    if type(obj) is tuple and len(obj) == 1 and isinstance(obj[0], torch.Tensor):
        fn = obj[0].grad_fn
        return [fn] if fn is not None else []
    out: list[Any] = []
    todo = [(obj, 0)]
    while todo and len(out) < limit:
        o, d = todo.pop()
        if isinstance(o, torch.Tensor):
            fn = o.grad_fn
            if fn is not None and all(fn is not x for x in out):
                out.append(fn)
        elif d < 3 and isinstance(o, (tuple, list)):
            todo.extend((x, d + 1) for x in o)
        elif d < 3 and isinstance(o, dict):
            todo.extend((x, d + 1) for x in o.values())
    return out


def _cuda_ready() -> bool:
    """CUDA is used by the script (never initialised by memscope)."""
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


def _cuda_alloc() -> tuple[int, int]:
    """(allocated, allocated peak) bytes of the current device: host-side counters only."""
    return int(torch.cuda.memory_allocated()), int(torch.cuda.max_memory_allocated())

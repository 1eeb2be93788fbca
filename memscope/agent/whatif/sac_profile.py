"""Op-level profile of one call of a repeated block, for the selective-checkpointing plan
(memscope.analysis.sac_plan): every aten op the block's forward runs, with the storages it
returns, its FLOPs (torch.utils.flop_counter's formulas), and which storages autograd saved for
backward (a saved-tensor pack hook sees each one).

The profile watches the block's real forward (no extra forward: an extra one would draw from
the RNG and move buffers), and keeps no reference to a tensor: storages are numbered through
weakrefs, which die with them. Submodule calls are seen through hooks on the block's own
submodules (no global module hooks), removed when the recording ends. The pack hook returns
the tensor it is given, so autograd keeps what it kept before. While it runs it is the
innermost saved-tensor hook, so a hook of the user's (offloading) would not see that one call's
tensors: whatif's profile runs only (the default profile, memscope.agent.whatif.sac_once, is
not taken under such hooks).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memscope.agent.torchcompat.storages import storages
from memscope.agent.torchcompat.unseen import unseen

# CPU's SDPA kernel has no formula in torch.utils.flop_counter: the flash formula fits it
_SDPA_CPU = "aten._scaled_dot_product_flash_attention_for_cpu"


def flop_mapping() -> dict[Any, Callable[..., int]]:
    """The formulas torch.utils.flop_counter lacks (CPU's SDPA kernel), taking shapes: pass it as
    ``FlopCounterMode(custom_mapping=...)`` to count what the profile counts."""
    from torch.utils.flop_counter import sdpa_flop_count

    packet = getattr(torch.ops.aten, _SDPA_CPU.split(".", 1)[1], None)
    if packet is None:
        return {}

    def sdpa_cpu(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return int(sdpa_flop_count(tuple(query), tuple(key), tuple(value)))

    return {packet: sdpa_cpu}


def formulas() -> dict[Any, Callable[..., int]]:
    """Overload packet -> FLOPs of one call (tensors in, as FlopCounterMode calls them)."""
    from torch.utils.flop_counter import flop_registry, shape_wrapper

    return {**flop_registry, **{k: shape_wrapper(v) for k, v in flop_mapping().items()}}


class BlockProfile:
    """Records one forward call. ``record(fn, *args, **kwargs)`` runs it and returns its output;
    ``as_json()`` is the profile (see module docstring)."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []
        self.sizes: list[int] = []  # storage number -> bytes
        self.made: list[bool] = []  # storage number -> created by an op of the block
        self.died: list[int | None] = []  # storage number -> ops run when it was freed (None: outlived the forward)
        self.saved: set[int] = set()
        self.last_pack = 0  # ops run before the last pack: where recomputation stops early
        self._refs: dict[int, tuple[int, Any]] = {}  # id(storage) -> (number, weakref)
        self._recording = True
        self.calls: list[list[Any]] = []  # [first op, ops run at return, [output storages]]
        self._formulas = formulas()
        self._handles: list[Any] = []
        self._hooks: Any = None
        self._mode: Any = None
        self._pack: Any = None

    @unseen
    def _number(self, t: torch.Tensor, made: bool) -> list[int]:
        found = []
        for st, nbytes in storages(t):
            key = id(st)
            hit = self._refs.get(key)
            if hit is not None and hit[1]() is st:
                found.append(hit[0])
                continue
            n = len(self.sizes)
            self.sizes.append(nbytes)
            self.made.append(made)
            self.died.append(None)
            self._refs[key] = (n, weakref.ref(st, self._freed(n)))
            found.append(n)
        return found

    def _freed(self, n: int) -> Callable[[Any], None]:
        # when a storage dies during the forward: how high the block's own tensors stack up
        # when the forward is rerun in backward (memscope.analysis.sac_plan.BlockProfile.rerun_bytes)
        def callback(ref: Any) -> None:
            try:
                if self._recording:
                    self.died[n] = len(self.ops)
            except Exception:
                pass
        return callback

    def _tensors(self, obj: Any) -> list[torch.Tensor]:
        from torch.utils._pytree import tree_leaves

        return [x for x in tree_leaves(obj) if isinstance(x, torch.Tensor)]

    def record(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (a block, or its forward bound to it) and record it."""
        bound = getattr(fn, "args", None) or (None,)  # functools.partial(Block.forward, block)
        block = fn if isinstance(fn, torch.nn.Module) else bound[0]
        self.begin(block, args, kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            self.end()

    def begin(self, block: Any, args: Any, kwargs: Any) -> None:
        """Start recording a call of ``block`` with these inputs, until :meth:`end` (same thread):
        the dispatch mode and the pack hook are entered, and each submodule of ``block`` gets a
        forward pre-hook and hook of its own (the module's, not global ones), all removed by
        :meth:`end`."""
        profile = self
        try:
            for t in self._tensors((args, kwargs)):
                self._number(t, False)
        except Exception:
            pass  # an input without storage: its ops are still recorded

        class _Mode(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # else torch wraps __torch_dispatch__ in torch._disable_dynamo, which imports
                # torch._dynamo at the first op (about a second of CPU, into a process that may
                # never compile) and costs a frame-evaluation switch per op; the profile is never
                # taken while Dynamo compiles (memscope.agent.whatif.sac_once)
                return False

            def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
                kw = kw or {}
                try:
                    ins = {n for t in profile._tensors((a, kw)) for n in profile._number(t, False)}
                except Exception:
                    ins = set()
                out = func(*a, **kw)
                record: dict[str, Any] = {"op": str(func.overloadpacket), "flops": 0, "out": [], "alias": []}
                try:
                    outs = [n for t in profile._tensors(out) for n in profile._number(t, True)]
                    fn = profile._formulas.get(func.overloadpacket)
                    flops = int(fn(*a, **kw, out_val=out)) if fn is not None else 0
                    record.update(flops=flops, out=outs, alias=sorted(set(outs) & ins))
                except Exception:
                    pass  # kept as an op without outputs: the op count (last_pack) stays right
                profile.ops.append(record)
                return out

        def pack(t: torch.Tensor) -> torch.Tensor:
            try:
                profile.saved.update(profile._number(t, False))
                profile.last_pack = len(profile.ops)
            except Exception:
                pass
            return t

        # each submodule call, as (first op, ops run at its return, its output's storages): what
        # a call made and did not return dies with its locals when it returns, had autograd not
        # kept it (which checkpointing does not): memscope.analysis.sac_plan reads it so
        stack: list[int] = []

        def enter(module: Any, inputs: Any) -> None:
            stack.append(len(profile.ops))

        def leave(module: Any, inputs: Any, output: Any) -> None:
            try:
                first = stack.pop()
                outs = sorted({n for t in profile._tensors(output) for n in profile._number(t, True)})
                profile.calls.append([first, len(profile.ops), outs])
            except Exception:
                pass

        self._handles = []
        if isinstance(block, torch.nn.Module):
            for m in block.modules():
                if m is not block:  # the block's own call is the whole record
                    self._handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
        self._pack = pack
        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        self._mode = _Mode()
        self._mode.__enter__()

    def end(self) -> None:
        """Stop recording: leave the mode and the pack hook when they are the innermost (a
        forward that left a mode or hook of its own on top is not unwound by this one), remove
        the submodules' hooks."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        try:
            mode: Any = self._mode
            if mode is not None and id(_get_current_dispatch_mode()) == id(mode):
                mode.__exit__(None, None, None)
                self._mode = None
                top = torch._C._autograd._top_saved_tensors_default_hooks(False)
                if self._hooks is not None and top and top[0] is self._pack:
                    self._hooks.__exit__(None, None, None)
                    self._hooks = None
        finally:
            for h in self._handles:
                h.remove()
            self._handles = []
            self._recording = False
            self._refs = {}  # dropping the weakrefs drops their callbacks

    def as_json(self) -> dict[str, Any]:
        return {"ops": self.ops, "storages": [{"bytes": b, "made": m, "died": d}
                                              for b, m, d in zip(self.sizes, self.made, self.died)],
                "saved": sorted(self.saved), "last_pack": self.last_pack, "calls": self.calls}

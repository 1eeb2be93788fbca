"""Selective checkpointing inside the training process, for ``memscope whatif``:

* ``sac_profile``: the first grad-mode forward of the first repeated block
  (:func:`memscope.agent.whatif.techniques.choose_blocks`) is recorded op by op
  (:class:`memscope.agent.whatif.sac_profile.BlockProfile`) and written as a ``sac_profile`` event;
  the block then runs unwatched.
* ``selective_checkpointing``: every repeated block runs under
  ``checkpoint(..., use_reentrant=False, context_fn=...)`` with the policy of
  ``create_selective_checkpoint_contexts``: the outputs of the ops in ``sac_save`` are kept
  (MUST_SAVE), every other op is recomputed in backward (PREFER_RECOMPUTE).

Forwards are patched on the class for the chosen instances only, as techniques.py does.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch


def default_save() -> list[str]:
    """Without a plan: keep the output of every op that has a FLOP formula (matmuls, attention,
    convolutions) and recompute the rest, the selective recomputation of Korthikanti et al."""
    from memscope.agent.whatif.sac_profile import formulas

    return sorted(str(k) for k in formulas())


def policy_for(save: list[str]) -> Callable[..., Any]:
    from torch.utils.checkpoint import CheckpointPolicy

    keep = frozenset(save)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if str(func.overloadpacket) in keep:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def apply(agent: Any, root: Any, technique: str, patch: Callable[..., None], peak: Any = None) -> None:
    from memscope.agent.whatif.techniques import choose_blocks

    container, blocks = choose_blocks(root)
    why = ("no repeated blocks (a ModuleList / Sequential of same-type modules)" if not blocks
           else _compiled(root, blocks))
    if why:
        agent.event("technique", f"{technique}: not applied: {why}",
                    {"technique": technique, "applied": False, "why": why})
        return
    if technique == "sac_profile":
        _profile_first(agent, container, blocks, patch)
        if peak is not None:
            _live_in_backward(agent, blocks, patch, peak)
        return
    save = agent.options.sac_save if agent.options.sac_save is not None else default_save()
    if agent.options.sac_blocks:
        blocks = blocks[:agent.options.sac_blocks]
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    context_fn = functools.partial(create_selective_checkpoint_contexts, policy_for(save))

    def wrap(orig: Callable[..., Any], module: Any, args: Any, kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return orig(module, *args, **kwargs)
        return checkpoint(functools.partial(orig, module), *args, use_reentrant=False,
                          context_fn=context_fn, **kwargs)

    cache_off = _no_kv_cache(root)
    for b in blocks:
        patch(type(b), "selective_checkpointing", b, wrap)
    also = f"; {cache_off}.use_cache = False (as gradient_checkpointing_enable sets it)" if cache_off else ""
    agent.event("technique", f"selective_checkpointing: {len(blocks)} {type(blocks[0]).__name__} blocks "
                             f"{container}[0..{len(blocks) - 1}], saving {', '.join(save) or 'nothing'}{also}",
                {"technique": "selective_checkpointing", "applied": True, "container": container,
                 "blocks": len(blocks), "save": list(save), "use_cache_off": bool(cache_off)})


def _no_kv_cache(root: Any) -> str:
    """A transformers model keeps a KV cache in training unless told not to: it grows between a
    block's forward and its recompute, which then runs other ops (SAC's replay fails: "aten.slice
    encountered during backward but not found in storage"). Its own gradient_checkpointing_enable
    turns the cache off; the trial does the same. Returns the config's owner's name, '' if none."""
    for name, m in root.named_modules():
        cfg: Any = getattr(m, "config", None)
        if getattr(cfg, "use_cache", None) is True:
            cfg.use_cache = False
            return f"{name or type(root).__name__}.config"
    return ""


def _compiled(root: Any, blocks: list[Any]) -> str:
    """Why not, when the blocks run compiled: Dynamo would trace the wrapper (a checkpoint with
    a ``context_fn`` under torch.compile is its own feature, with its own warning into the
    script's output) and the profile's dispatch mode; a compiled model is left as it is."""
    from memscope.agent.torchcompat.compiled import is_compiling, optimized_module_type

    compiled = optimized_module_type()
    for m in [root, *blocks]:
        if (compiled is not None and isinstance(m, compiled)) or getattr(m, "_compiled_call_impl", None) is not None:
            return ("the model runs under torch.compile: selective checkpointing inside a compiled "
                    "region is torch.compile's to plan (the code printed applies to the eager model)")
    if is_compiling():
        return "called while torch.compile traces the model"
    return ""


def _profile_first(agent: Any, container: str, blocks: list[Any], patch: Callable[..., None]) -> None:
    from memscope.agent.whatif.sac_profile import BlockProfile

    first = blocks[0]
    done: list[bool] = []

    def wrap(orig: Callable[..., Any], module: Any, args: Any, kwargs: Any) -> Any:
        if done or not torch.is_grad_enabled():
            return orig(module, *args, **kwargs)
        done.append(True)
        profile = BlockProfile()
        # the profile's own bookkeeping catches its errors: what raises here is the block's
        out = profile.record(functools.partial(orig, module), *args, **kwargs)
        try:
            agent.event("sac_profile", f"{type(first).__name__} {container}.0: {len(profile.ops)} ops",
                        {"container": container, "block_type": type(first).__name__,
                         "blocks": len(blocks), **profile.as_json()})
        except Exception:
            pass
        return out

    patch(type(first), "sac_profile", first, wrap)


def _live_in_backward(agent: Any, blocks: list[Any], patch: Callable[..., None], peak: Any) -> None:
    """Once, in a step whose tensor peak is measured: for every block, the live tensor bytes when
    its forward began, when the gradient of its output is ready (its backward, where checkpointing recomputes it, is
    about to start) and the most live bytes until its input's gradient is ready, and the step's
    peak before the first of these (its forward), as a ``sac_live`` event. The step's running
    peak is reset for each window and restored after. Hooks on the blocks' output tensors and
    the first block's input, holding nothing but the counter; a block called out of order, or
    a window left open, gives no event and leaves the step's peak as it was."""
    n = len(blocks)
    index = {id(b): k for k, b in enumerate(blocks)}
    state: dict[str, Any] = {"next": 0, "done": False, "open": None, "windows": {}}

    def boundary(opens: int | None) -> Callable[[Any], None]:
        # the gradient of a block boundary is ready: close the window of the block after it (if
        # open) and open the window of the block before it (None: the first block's input)
        def hook(grad: Any) -> None:
            try:
                with peak._lock:
                    if state["open"] is not None:
                        state["windows"][state["open"]] = (state["live"], peak.peak)
                        best = max(state["before"], peak.peak)
                    elif opens == n - 1:
                        best = peak.peak
                        state["forward"] = best
                    else:
                        return  # out of order: nothing was reset
                    if opens is not None and (state["open"] is None or opens == state["open"] - 1):
                        state.update(open=opens, before=best, live=peak.total)
                        peak.peak = peak.total
                        return
                    peak.peak = best
                    state["open"] = None
                if opens is None and len(state["windows"]) == n:
                    w = [state["windows"][k] for k in range(n)]
                    agent.event("sac_live", f"step {state['step']}: {w[-1][0]} live tensor bytes at the last "
                                            f"block's backward, {w[-1][1]} at most during it",
                                {"step": state["step"], "live_bytes": w[-1][0], "window_peak": w[-1][1],
                                 "forward_peak": state["forward"], "blocks": [list(x) for x in w],
                                 "forward_starts": state["starts"]})
            except Exception:
                pass
        return hook

    def wrap(orig: Callable[..., Any], module: Any, args: Any, kwargs: Any) -> Any:
        start = peak.total
        out = orig(module, *args, **kwargs)
        if state["done"] or not torch.is_grad_enabled() or not peak.active:
            return out
        k = index.get(id(module))
        try:
            state.setdefault("starts", []).append(start)
            if k is None or k != state["next"] or (k == 0 and "step" in state):
                state["done"] = True  # out of order: the hooks registered so far find no open window
                return out
            x = args[0] if args else None
            if not (isinstance(out, torch.Tensor) and out.requires_grad and isinstance(x, torch.Tensor)
                    and x.requires_grad):
                state["done"] = True
                return out
            if k == 0:
                state["step"] = peak.step
                x.register_hook(boundary(None))
            out.register_hook(boundary(k))
            state["next"] = k + 1
            if k == n - 1:
                state["done"] = True
        except Exception:
            state["done"] = True
        return out

    for b in blocks:
        patch(type(b), "sac_live", b, wrap)

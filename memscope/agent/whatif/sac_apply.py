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
    if not blocks:
        why = "no repeated blocks (a ModuleList / Sequential of same-type modules)"
        agent.event("technique", f"{technique}: not applied: {why}",
                    {"technique": technique, "applied": False, "why": why})
        return
    if technique == "sac_profile":
        _profile_first(agent, container, blocks, patch)
        if peak is not None:
            _live_at_last_backward(agent, blocks[-1], patch, peak)
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

    for b in blocks:
        patch(type(b), "selective_checkpointing", b, wrap)
    agent.event("technique", f"selective_checkpointing: {len(blocks)} {type(blocks[0]).__name__} blocks "
                             f"{container}[0..{len(blocks) - 1}], saving {', '.join(save) or 'nothing'}",
                {"technique": "selective_checkpointing", "applied": True, "container": container,
                 "blocks": len(blocks), "save": list(save)})


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


def _live_at_last_backward(agent: Any, last: Any, patch: Callable[..., None], peak: Any) -> None:
    """Once, in a step whose tensor peak is measured: the live tensor bytes when the gradient of
    the last block's output is ready (its backward, the first to recompute under
    checkpointing, is about to start) and the most live bytes until its input's gradient is
    ready (the step's running peak is reset for that window and restored after), as a
    ``sac_live`` event. Hooks on the output and input tensors, holding nothing but the counter."""
    done: list[bool] = []

    def wrap(orig: Callable[..., Any], module: Any, args: Any, kwargs: Any) -> Any:
        out = orig(module, *args, **kwargs)
        if done or not torch.is_grad_enabled() or not peak.active or not isinstance(out, torch.Tensor) \
                or not out.requires_grad:
            return out
        done.append(True)
        step = peak.step
        state: dict[str, int] = {}

        def start(grad: Any) -> None:  # the last block's backward begins: a window on the peak
            try:
                with peak._lock:
                    state["live"], state["before"] = peak.total, peak.peak
                    peak.peak = peak.total
            except Exception:
                pass

        def end(grad: Any) -> None:  # its input's gradient is ready: the window closes
            if "live" not in state or "window" in state:
                return
            try:
                with peak._lock:
                    state["window"] = peak.peak
                    peak.peak = max(peak.peak, state["before"])
                agent.event("sac_live", f"step {step}: {state['live']} live tensor bytes at the last "
                                        f"block's backward, {state['window']} at most during it",
                            {"step": step, "live_bytes": state["live"], "window_peak": state["window"]})
            except Exception:
                pass

        x = args[0] if args else None
        if not (isinstance(x, torch.Tensor) and x.requires_grad):
            return out  # no end to the window: the step's peak must not be reset
        try:
            x.register_hook(end)
            out.register_hook(start)
        except Exception:
            pass
        return out

    patch(type(last), "sac_live", last, wrap)

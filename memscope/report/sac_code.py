"""The selective-checkpointing plan as code the user pastes: a ``policy_fn`` for
``torch.utils.checkpoint.create_selective_checkpoint_contexts`` and each block wrapped in
``checkpoint(..., use_reentrant=False, context_fn=...)``; for Hugging Face models and Lightning,
the hook point that applies it without editing library code."""

from __future__ import annotations

from typing import Sequence


def policy_code(save: Sequence[str], container: str, block_type: str) -> str:
    ops = ", ".join(f"torch.ops.{name}" for name in save)
    blocks = f"model.{container}" if container else "model"
    return f'''import functools
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

SAVE = {{{ops}}}  # outputs kept for backward; every other op is recomputed


def policy_fn(ctx, op, *args, **kwargs):
    if op.overloadpacket in SAVE:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


context_fn = functools.partial(create_selective_checkpoint_contexts, policy_fn)


class Selective(torch.nn.Module):  # wraps one {block_type}
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self.block(*args, **kwargs)
        return checkpoint(self.block, *args, use_reentrant=False, context_fn=context_fn, **kwargs)


for i, block in enumerate({blocks}):
    {blocks}[i] = Selective(block)

# Hugging Face: instead of the loop, model.gradient_checkpointing_enable(
#     gradient_checkpointing_kwargs={{"use_reentrant": False, "context_fn": context_fn}})
# (it also sets model.config.use_cache = False, which the loop needs: a KV cache that grows
# between a block's forward and its recompute makes the recompute run other ops)
# Lightning: do the loop above in LightningModule.configure_model (or before trainer.fit)'''

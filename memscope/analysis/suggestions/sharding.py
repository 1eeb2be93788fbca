"""sharding: parameters, gradients and optimizer state split over the ranks."""

from __future__ import annotations

from memscope.analysis.suggestions.facts import MIN_SHARE, Facts, Suggestion, _b

def sharding(f: Facts) -> list[Suggestion]:
    """ZeRO-3 / FSDP full sharding keeps 1/W of parameters, gradients and optimizer state."""
    w = f.world_size
    if w < 2:
        return []
    states = f.parameters + f.gradients + f.optimizer_state
    saving = states - states // w
    if f.share(saving) < MIN_SHARE:
        return []
    return [Suggestion(
        "sharding", saving,
        f"{w} ranks each hold all parameters {_b(f.parameters)}, gradients {_b(f.gradients)} and "
        f"optimizer state {_b(f.optimizer_state)}; sharded over {w} ranks each keeps 1/{w}",
        "wrap the model in FSDP (`torch.distributed.fsdp.fully_shard(block)` per block, then on "
        "the model; or FullyShardedDataParallel) or DeepSpeed ZeRO stage 3; ZeRO-1 (optimizer "
        f"state only, saves {_b(f.optimizer_state - f.optimizer_state // w)}) and ZeRO-2 (plus "
        "gradients) communicate less. Skip if the model is already sharded")]

"""The ``selective_checkpointing`` suggestion of ``report``: for a run whose baseline profiled a
repeated block op by op (``memscope whatif --try selective_checkpointing`` records it; the
``sac_profile`` option), the selective plan that keeps the least activations at fewer recompute
FLOPs than whole-block checkpointing, when there is one."""

from __future__ import annotations

from typing import Any

from memscope.analysis import sac_plan
from memscope.store.reader import RunReader
from memscope.units import human_bytes


def selective_suggestions(reader: RunReader) -> list[dict[str, Any]]:
    try:
        found = sac_plan.from_events(reader.events("sac_profile"), reader.events("sac_live"))
    except ValueError:
        return []
    if found is None:
        return []
    p = found[0]
    curve = sac_plan.curve(p)
    whole = next((pt for pt in curve if pt.save == () and pt.blocks == p.blocks), None)
    if whole is None:
        return []
    better = [pt for pt in curve if pt.save and pt.blocks == p.blocks and pt.recompute_flops < whole.recompute_flops]
    if not better:
        return []
    plan = min(better, key=lambda pt: (pt.activation_bytes, pt.recompute_flops))
    saving = p.saved_bytes * p.blocks - plan.activation_bytes
    if saving <= 0:
        return []
    keep = ", ".join(plan.save or ())
    return [{
        "technique": "selective_checkpointing", "estimated_saving_bytes": saving,
        "evidence": (f"{p.blocks} {p.block_type} blocks in {p.container or '<root>'} keep "
                     f"{human_bytes(p.saved_bytes)} each for backward; keeping only the outputs of {keep} "
                     f"keeps {human_bytes(plan.kept_bytes)} and recomputes {plan.recompute_flops_pct:.0f}% of "
                     f"the blocks' forward FLOPs (whole-block checkpointing: {whole.recompute_flops_pct:.0f}%)"),
        "how": (f"wrap each block in torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, "
                f"context_fn=functools.partial(create_selective_checkpoint_contexts, policy_fn)) with a "
                f"policy_fn that returns MUST_SAVE for {keep} and PREFER_RECOMPUTE otherwise; "
                f"`memscope whatif --try selective_checkpointing SCRIPT.py` prints the code and measures it"),
    }]

"""The ``selective_checkpointing`` suggestion of ``report``: for a run that profiled a repeated
block op by op (a plain ``attach`` run by default: the ``block_profile`` option,
memscope.agent.whatif.sac_once; a ``memscope whatif`` baseline: the ``sac_profile`` option), the
plan of :func:`memscope.analysis.sac_plan.suggested` (the least kept for at most half of
whole-block checkpointing's recompute FLOPs). Its saving is the predicted peak saving where the
run measured its tensor peak and the blocks' backward windows (whatif), else the activation
bytes the plan saves, an upper bound (17.9% over the measured saving on tiny_gpt, 20.0% on
nanoGPT: tests/test_sac_default.py checks it within 25%)."""

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
    p, backward = found
    plan = sac_plan.suggested(p)
    whole = sac_plan.point(p, frozenset())
    if not plan.save or plan.recompute_flops >= whole.recompute_flops:
        return []
    peaks = [int(e["data"]["peak_bytes"]) for e in reader.events("tensor_peak")
             if isinstance(e.get("data"), dict) and isinstance(e["data"].get("peak_bytes"), int)]
    if peaks and backward is not None:  # the measured baseline: the predicted peak saving
        saving = max(peaks) - sac_plan.predicted_peak(max(peaks), backward, p, plan)
    else:
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

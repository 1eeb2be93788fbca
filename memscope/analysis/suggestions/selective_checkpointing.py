"""The ``selective_checkpointing`` suggestion of ``report``: for a run that profiled a repeated
block op by op (a plain ``attach`` run by default: the ``block_profile`` option,
memscope.agent.whatif.sac_once; a ``memscope whatif`` baseline: the ``sac_profile`` option), the
plan of :func:`memscope.analysis.sac_plan.suggested` (the least kept for at most half of
whole-block checkpointing's recompute FLOPs). Its saving is the step's peak now less the peak
under the plan, the model whole-block checkpointing's figure comes from
(memscope.analysis.checkpoint_peak through :func:`.checkpointing.checkpoint_plan`: the blocks'
backward as a what-if baseline measured it, else modelled). Where the profiled blocks are not
the ones the layer rows show, the activation bytes the plan saves, an upper bound."""

from __future__ import annotations

from memscope.analysis import sac_plan
from memscope.analysis.suggestions.checkpointing import checkpoint_plan
from memscope.analysis.suggestions.facts import Facts, Suggestion, transformers_model
from memscope.store.reader import RunReader
from memscope.units import human_bytes


def selective_checkpointing(reader: RunReader, f: Facts | None) -> list[Suggestion]:
    if f is not None and f.block_profile is not None:
        p = f.block_profile
    else:
        try:
            found = sac_plan.from_events(reader.events("sac_profile"), reader.events("sac_live"))
        except ValueError:
            return []
        if found is None:
            return []
        p = found[0]
    plan = sac_plan.suggested(p)
    whole = sac_plan.point(p, frozenset())
    if not plan.save or plan.recompute_flops >= whole.recompute_flops:
        return []
    ck = checkpoint_plan(f, plan) if f is not None else None
    saving = ck.saving if ck is not None else p.saved_bytes * p.blocks - plan.activation_bytes
    if saving <= 0:
        return []
    keep = ", ".join(plan.save or ())
    at = (f"; the step's live-tensor peak {human_bytes(ck.peak_now)} becomes {human_bytes(ck.after.bytes)} "
          f"(highest at {ck.after.at})" if ck is not None else "")
    return [Suggestion(
        "selective_checkpointing", saving,
        f"{p.blocks} {p.block_type} blocks in {p.container or '<root>'} keep "
        f"{human_bytes(p.saved_bytes)} each for backward; keeping only the outputs of {keep} "
        f"keeps {human_bytes(plan.kept_bytes)} and recomputes {plan.recompute_flops_pct:.0f}% of "
        f"the blocks' forward FLOPs (whole-block checkpointing: {whole.recompute_flops_pct:.0f}%){at}",
        _how(keep, transformers_model(f.layers) if f is not None else None),
        ck.as_json() if ck is not None else None)]


def _how(keep: str, hf: str | None) -> str:
    policy = (f"a policy_fn that returns MUST_SAVE for {keep} and PREFER_RECOMPUTE otherwise; "
              "`memscope whatif --try selective_checkpointing SCRIPT.py` prints the code and measures it")
    contexts = "functools.partial(create_selective_checkpoint_contexts, policy_fn)"
    if hf:  # blocks wrapped by hand run with the KV cache on, and the recompute replays other ops
        return (f"call `model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
                f"{{\"use_reentrant\": False, \"context_fn\": {contexts}}})` ({hf} is "
                "a transformers model: it wraps its blocks and sets config.use_cache = False, which a "
                f"block wrapped by hand also needs), with {policy}")
    return (f"wrap each block in torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, "
            f"context_fn={contexts}) with {policy}")

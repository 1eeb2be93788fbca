"""fit_plan: the cheapest combination of techniques for a run near its GPU's limit."""

from __future__ import annotations

from memscope.analysis.suggestions.checkpointing import activation_checkpointing
from memscope.analysis.suggestions.facts import Facts, Suggestion, _b
from memscope.analysis.suggestions.gradient_accumulation import gradient_accumulation
from memscope.analysis.suggestions.lighter_optimizer import lighter_optimizer
from memscope.analysis.suggestions.mixed_precision import mixed_precision
from memscope.analysis.suggestions.sharding import sharding

NEAR_LIMIT = 0.90  # reserved at least this share of the device: plan for it (fit_plan)


def fit_plan(f: Facts) -> list[Suggestion]:
    """A run near its GPU's limit: the cheapest combination of techniques that leaves the CUDA
    context and the fragmentation allowance free, as ``memscope fit`` ranks plans
    (memscope.analysis.fit), with peaks composed from the other rules' estimated savings."""
    from memscope.analysis import fit as planning

    r = f.cuda_peak
    if not f.device_total or r is None or not r.get("reserved"):
        return []
    reserved = int(r["reserved"])
    if reserved < NEAR_LIMIT * f.device_total:
        return []
    peak = int(r.get("allocated_peak") or r.get("allocated") or reserved)
    allowance = planning.Allowance()
    usable = allowance.usable(f.device_total)
    savings = {s.technique: s.estimated_saving_bytes
               for rule in (mixed_precision, activation_checkpointing, gradient_accumulation,
                            lighter_optimizer, sharding) for s in rule(f)}
    plans = planning.plan_from_savings(peak, usable, savings, f.activations, f.world_size)
    chosen = next((p for p in plans if p.fits), None)
    if chosen is None:
        chosen = min(plans, key=lambda p: p.peak_bytes) if plans else None
    if chosen is None or peak - chosen.peak_bytes <= 0:
        return []
    names = " + ".join(t["technique"] for t in chosen.techniques)
    verdict = "the cheapest plan that fits" if chosen.fits else "no plan of these fits; the one that saves most"
    size = f"{f.device_total / 2**30:.0f}GiB"
    return [Suggestion(
        "fit_plan", peak - chosen.peak_bytes,
        f"{_b(reserved)} reserved at the highest, {reserved / f.device_total:.0%} of the "
        f"{_b(f.device_total)} device ({_b(peak)} allocated); {allowance.describe(f.device_total)}",
        f"{verdict}: {names} (predicted allocator peak {_b(chosen.peak_bytes)} of "
        f"{_b(usable)} usable; cost: {chosen.cost}), composed from the other suggestions' savings; for "
        f"plans measured by fake runs of the script, with the largest micro-batch: "
        f"`memscope fit --gpu {size} SCRIPT.py ARGS`")]

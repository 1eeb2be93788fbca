"""single_precision: a float64 model trained in float32."""

from __future__ import annotations

from memscope.analysis.suggestions.facts import MIN_SHARE, Facts, Suggestion, _b, _float64_share

def single_precision(f: Facts) -> list[Suggestion]:
    """A float64 model (``.double()``, ``set_default_dtype(torch.float64)``): autocast leaves
    float64 tensors alone, so mixed precision would change nothing; float32 halves the float64
    share of the parameters, gradients and optimizer state, and the float64 activations."""
    share = _float64_share(f)
    if share < 0.5:
        return []
    acts = sum(f.activation_dtypes.values())
    act_share = f.activation_dtypes.get("float64", 0) / acts if acts else share
    states = int((f.parameters + f.gradients + f.optimizer_state) * share)
    activations = int(f.activations * act_share)
    saving = (states + activations) // 2
    if saving <= 0 or f.share(saving) < MIN_SHARE:
        return []
    return [Suggestion(
        "single_precision", saving,
        f"{share:.0%} of the parameters are float64, and {act_share:.0%} of the activations; "
        f"autocast casts only float32 tensors, so mixed precision would change nothing here; "
        f"float32 halves {_b(states)} of parameters, gradients and optimizer state and "
        f"{_b(activations)} of activations {f.basis}",
        "build the model and its inputs in float32 (drop `.double()`, `dtype=torch.float64`, "
        "`torch.set_default_dtype(torch.float64)`) and check the loss still converges (float32 "
        "keeps about 7 significant digits); autocast (mixed_precision) can then halve the "
        "activations again")]

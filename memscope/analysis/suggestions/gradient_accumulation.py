"""gradient_accumulation: a smaller micro-batch, the same effective batch."""

from __future__ import annotations

from memscope.analysis.suggestions.facts import ACTIVATION_SHARE, Facts, Suggestion, _b

ACCUMULATION = 2  # gradient accumulation: the micro-batch is divided by this


def gradient_accumulation(f: Facts) -> list[Suggestion]:
    """Activations scale with the micro-batch: dividing it by k divides them by k."""
    if f.share(f.activations) < ACTIVATION_SHARE:
        return []
    k = ACCUMULATION
    saving = f.activations - f.activations // k
    n = max(1, (f.micro_batches or 1) - f.closure_forwards)  # the script's own micro-batches
    if f.closure_forwards:  # LBFGS-style: the optimizer re-evaluates the whole loss in a closure
        how = (f"the optimizer evaluates a closure ({f.closure_forwards} forwards in the step, each "
               f"of the whole batch): inside the closure, run the batch in {k} parts and call "
               f"`(loss_fn(model(part), target_part) / {k}).backward()` on each, returning the "
               "summed loss: the optimizer sees the same loss and gradients (up to BatchNorm "
               "statistics), at the cost of smaller, slower matmuls")
    elif n > 1:  # the script already accumulates: more, smaller micro-batches
        how = (f"the script already accumulates {n} micro-batches per optimizer step: divide the "
               f"micro-batch by {k} and accumulate {n * k} (each loss divided by {n * k}): the same "
               "effective batch and the same gradients (up to BatchNorm statistics), at the cost of "
               "smaller, slower matmuls")
    else:
        how = (f"divide the batch size by {k} and call optimizer.step() / zero_grad() every {k} "
               f"micro-batches, with `(loss / {k}).backward()`: the same effective batch and the same "
               "gradients (up to BatchNorm statistics), at the cost of smaller, slower matmuls")
    return [Suggestion(
        "gradient_accumulation", saving,
        f"activations {_b(f.activations)} are {f.share(f.activations):.0%} of {_b(f.tensor_total)} "
        f"of tensors {f.basis} and scale with the micro-batch; a {k}x smaller micro-batch keeps "
        f"{_b(f.activations // k)}", how)]

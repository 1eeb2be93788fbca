"""gradient_accumulation: a smaller micro-batch, the same effective batch."""

from __future__ import annotations

from memscope.analysis.suggestions.facts import ACTIVATION_SHARE, Facts, Suggestion, _b

ACCUMULATION = 2  # gradient accumulation: the micro-batch is divided by this


def batch_scaled(f: Facts) -> tuple[int, int]:
    """(bytes live at the peak that scale with the micro-batch, gradient bytes accumulation adds).

    With the live-tensor peak (``Facts.tensor_peak``: one measured step of a plain CPU run, every
    step of a what-if baseline, the allocator's peak on CUDA), all that
    is not model state: the activations and the working set beside them (the logits, a float32
    copy of them for the loss, the loss's gradient), which a peft GPT-2 and the HF Trainer have
    as large as their activations (the figure was half the saving measured at half the batch).
    Gradients the script freed before the peak (``zero_grad()`` ahead of the forward) are not
    state at the peak, but accumulation keeps them live through every micro-batch after the
    first: they are taken off the saving (word_language_model: 28 MiB saved by accumulating,
    43 MiB by the smaller batch alone). Gradients made by the backward before the peak count as
    freed: the saving is not overstated. A script that accumulates already peaks in a later
    micro-batch, its gradients live (2 x 1024 rows to 4 x 512: 6.5 MiB measured, 6.5 MiB
    without taking them off, 5.5 MiB with). Without the peak (CPU runs from before it, or a
    step not measured: torch.compile), the activations alone. Where the step's optimizer step
    peaks apart (``Facts.step_peaks``), the peak outside it: the optimizer's temporaries do not
    scale with the micro-batch."""
    peak = f.model_peak
    if peak is None:
        return f.activations, 0
    missing = max(0, f.gradients - f.peak_grads) if f.peak_grads is not None else 0
    if (f.micro_batches or 1) - f.closure_forwards > 1:
        missing = 0
    states = f.parameters + f.gradients - missing + f.optimizer_state
    return max(f.activations, peak - states), missing


def gradient_accumulation(f: Facts) -> list[Suggestion]:
    """What scales with the micro-batch: dividing it by k divides that by k."""
    if f.share(f.activations) < ACTIVATION_SHARE or f.evaluation:  # an evaluation: no_grad
        return []
    k = ACCUMULATION
    scaled, grads = batch_scaled(f)
    model_side = scaled - scaled // k - grads
    if model_side <= 0:
        return []
    # the optimizer's step keeps its peak (the same gradients, states and temporaries)
    saving = f.step_peaks.saving(model_side) if f.step_peaks is not None else model_side
    if saving <= 0:
        return []
    n = max(1, (f.micro_batches or 1) - f.closure_forwards)  # the script's own micro-batches
    if len(f.optimizers) > 1:  # a GAN's discriminator and generator: forwards feed different optimizers
        how = (f"the step runs {len(f.optimizers)} optimizers ({', '.join(f.optimizers)}), each "
               f"after its own forwards and backwards: divide the batch size by {k}, run each "
               f"model's forward and backward on {k} smaller batches (each loss divided by {k}) before "
               "its optimizer steps once: each optimizer sees the same effective batch and the same "
               "gradients (up to BatchNorm statistics), at the cost of smaller, slower matmuls")
    elif f.closure_forwards:  # LBFGS-style: the optimizer re-evaluates the whole loss in a closure
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
    evidence = (f"activations {_b(f.activations)} are {f.share(f.activations):.0%} of {_b(f.tensor_total)} "
                f"of tensors {f.basis} and scale with the micro-batch")
    if scaled > f.activations:
        evidence += f", with the {_b(scaled - f.activations)} of working tensors beside them (logits, loss)"
    evidence += f"; a {k}x smaller micro-batch keeps {_b(scaled // k)}"
    if grads:
        evidence += (f", and the {_b(grads)} of gradients the script frees before its forward stay "
                     "live across the micro-batches")
    if f.step_peaks is not None:
        evidence += f.step_peaks.capped(model_side)
    return [Suggestion("gradient_accumulation", saving, evidence, how)]

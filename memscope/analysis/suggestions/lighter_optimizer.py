"""lighter_optimizer: one optimizer state per parameter instead of two (or a shorter LBFGS history)."""

from __future__ import annotations

from memscope.analysis.oom import full_state
from memscope.analysis.step_peaks import StepPeaks
from memscope.analysis.suggestions.facts import MIN_SHARE, OPTIMIZER_SHARE, Facts, Suggestion, _b

ADAM_RATIO = 1.5  # optimizer state / trainable parameter bytes above this: two states per parameter


def lighter_optimizer(f: Facts) -> list[Suggestion]:
    """Two states per parameter (Adam, AdamW) -> one (SGD with momentum): saves one copy. When
    the run ran out of memory while the optimizer built its state (Adam at its first step), the
    whole state it builds is the measure, not the part built when it failed."""
    trainable = f.trainable_bytes
    state, building = f.optimizer_state, ""
    opt = f.failed_optimizer
    full = full_state(opt)
    if opt is not None and full is not None and full > (int(opt.get("state_bytes") or 0)):
        trainable = int(opt.get("trainable_bytes") or 0) or trainable
        state = max(state, full)
        building = (f" ({opt['class']} builds {_b(full)} of state, 2 per trainable parameter: it had "
                    f"built {_b(int(opt.get('state_bytes') or 0))} when its step ran out of memory)")
    if not trainable or f.share(state) < OPTIMIZER_SHARE:
        return []
    ratio = state / trainable
    if ratio < ADAM_RATIO:
        return []
    if f.closure_forwards and ratio > 2 * ADAM_RATIO:
        return _shorter_history(f, trainable, ratio)
    saving = state - trainable
    peaks = f.step_peaks if not building else None
    if peaks is not None:
        saving, at_step = _at_step_peak(peaks, saving)
    else:
        temps = _step_temporaries(f) if not building else 0
        saving += temps
        at_step = (f"; the step's live-tensor peak is in the optimizer's step, with {_b(temps)} of its "
                   "temporaries beside the states (Adam's square root of the second moment and its "
                   "denominator), which SGD's in-place step does not make" if temps else "")
    if saving <= 0:
        return []
    return [Suggestion(
        "lighter_optimizer", saving,
        f"optimizer state {_b(state)}{building} is {ratio:.1f}x the {_b(trainable)} of trainable "
        f"parameters ({f.share(state):.0%} of {_b(f.tensor_total)} of tensors): two "
        f"states per parameter, Adam-like; SGD with momentum keeps one{at_step}",
        "torch.optim.SGD(params, lr=..., momentum=0.9) keeps one state (saves this estimate; needs "
        "its own learning-rate tuning); to keep Adam's behaviour, 8-bit Adam "
        "(bitsandbytes.optim.AdamW8bit, CUDA) saves about 3/4 of the state, and a factored optimizer "
        "(Adafactor: transformers.optimization.Adafactor) nearly all of it")]


def _at_step_peak(p: StepPeaks, state: int) -> tuple[int, str]:
    """The saving at the step's peak, and its words, from the step's two peaks: one state less
    is ``state`` bytes off both (the states are live through the step); SGD's in-place update
    makes no temporaries, so its step peaks where it begins. The step's peak is then the higher
    of the two (pytorch/examples mnist with Adam at batch 16: the optimizer's step peaked 1.0 MiB
    above backward, with 9.0 MiB of temporaries; state plus temporaries, the figure was 7.7 MiB,
    +39% of the 5.6 MiB whatif measured: backward's peak less the state bounds it)."""
    temps = p.optimizer_temporaries
    after = p.after(state, p.optimizer - p.optimizer_start + state)
    where = "its forward and backward" if after == p.model - state else "its optimizer's step"
    words = (f"; the step's live tensors peak at {_b(p.peak)}, {_b(p.model)} outside the optimizer's step "
             f"and {_b(p.optimizer)} in it")
    if temps:
        words += (f", with {_b(temps)} of its temporaries beside the states there (Adam's square root of the "
                  "second moment and its denominator), which SGD's in-place step does not make")
    return p.peak - after, words + f": the peak becomes {_b(after)}, in {where}"


def _step_temporaries(f: Facts) -> int:
    """Where the step's live-tensor peak was reached in the optimizer's step (``Facts.peak_phase``),
    what was live there beside the model states and the activations: the step's temporaries
    (on CPU, Adam makes the square root of a parameter's second moment and the denominator of
    its update, a parameter's size each, for every parameter in turn; foreach Adam, one per
    parameter at once). SGD with momentum updates in place: they go with Adam. 0 elsewhere."""
    if f.peak_phase != "optimizer" or f.tensor_peak is None:
        return 0
    return max(0, f.tensor_peak - (f.parameters + f.gradients + f.optimizer_state + f.activations))


LBFGS_DEFAULT_HISTORY = 100  # torch.optim.LBFGS's history_size
LBFGS_SHORT_HISTORY = 10  # what lighter_optimizer proposes instead


def _shorter_history(f: Facts, trainable: int, ratio: float) -> list[Suggestion]:
    """A closure optimizer whose state is many copies of the parameters: LBFGS keeps two flat
    vectors per iteration (``old_dirs``, ``old_stps``) up to ``history_size``, plus two working
    ones (``d``, ``prev_flat_grad``). The history grows for the first 100 iterations, so the
    state measured early in a run is not yet its largest."""
    pairs = max(0, round((ratio - 2) / 2))
    kept = (2 * LBFGS_SHORT_HISTORY + 2) * trainable
    full = (2 * LBFGS_DEFAULT_HISTORY + 2) * trainable
    saving = f.optimizer_state - kept
    if saving <= 0 or f.share(saving) < MIN_SHARE:
        return []
    grows = (f"; it keeps growing to about {_b(full)} at the default history_size of "
             f"{LBFGS_DEFAULT_HISTORY}" if pairs < LBFGS_DEFAULT_HISTORY else "")
    return [Suggestion(
        "lighter_optimizer", saving,
        f"optimizer state {_b(f.optimizer_state)} is {ratio:.0f}x the {_b(trainable)} of trainable "
        f"parameters and the optimizer evaluates a closure: a history of flat copies of the "
        f"parameters (LBFGS: two per iteration, {pairs} pairs so far){grows}",
        f"torch.optim.LBFGS(params, history_size={LBFGS_SHORT_HISTORY}) bounds it at "
        f"{2 * LBFGS_SHORT_HISTORY + 2} copies of the parameters ({_b(kept)}); a shorter history "
        "approximates the curvature less well: check that the loss still converges")]

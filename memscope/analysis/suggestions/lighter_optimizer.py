"""lighter_optimizer: one optimizer state per parameter instead of two (or a shorter LBFGS history)."""

from __future__ import annotations

from memscope.analysis.oom import full_state
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
    return [Suggestion(
        "lighter_optimizer", saving,
        f"optimizer state {_b(state)}{building} is {ratio:.1f}x the {_b(trainable)} of trainable "
        f"parameters ({f.share(state):.0%} of {_b(f.tensor_total)} of tensors): two "
        "states per parameter, Adam-like; SGD with momentum keeps one",
        "torch.optim.SGD(params, lr=..., momentum=0.9) keeps one state (saves this estimate; needs "
        "its own learning-rate tuning); to keep Adam's behaviour, 8-bit Adam "
        "(bitsandbytes.optim.AdamW8bit, CUDA) saves about 3/4 of the state, and a factored optimizer "
        "(Adafactor: transformers.optimization.Adafactor) nearly all of it")]


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

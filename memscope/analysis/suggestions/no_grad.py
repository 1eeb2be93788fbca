"""no_grad: an evaluation that runs with autograd on saves activations for a backward that never
comes; under ``torch.no_grad()`` (or ``torch.inference_mode()``) it saves none."""

from __future__ import annotations

from memscope.analysis.suggestions.facts import Facts, Suggestion, _b


def no_grad(f: Facts) -> list[Suggestion]:
    """The run ran out of memory in a forward whose model was in eval mode, with activations
    saved for backward: all of them are the figure (what the failing moment held of them). An
    upper bound of what the failing moment would have held less: under ``no_grad`` the model's
    input and the failing layer's input are live there too (which tensors they were is not
    recorded): advice_cases.py's evaluation saved 36 MiB, 16 MiB of which no_grad frees then."""
    saved = f.evaluation_saved
    if not f.evaluation or saved <= 0:
        return []
    return [Suggestion(
        "no_grad", saved,
        f"the out-of-memory error came in an evaluation: the model was in eval mode, yet autograd "
        f"had saved {_b(saved)} of activations for a backward that never comes when it ran out of "
        "memory (more as the forward goes on: the saving grows with the batch); up to that much "
        "is freed at the failing moment: the model's input and the failing layer's input stay live "
        "under no_grad too",
        "run the evaluation under `with torch.no_grad():` (or `with torch.inference_mode():`, "
        "faster still, when its outputs are not used in training): the forward then saves nothing "
        "for backward; model.eval() alone changes dropout and batch norm, not what autograd keeps")]

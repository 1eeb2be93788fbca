"""Suggestions: which memory-saving techniques apply to a run, and how much each would save.

Pure functions over a run file (no torch). Each rule reads measured numbers (the breakdown at
the peak, the per-layer saved bytes of the profiled step nearest the peak, the parameter and
optimizer tensors of the last inventory, the CUDA allocator samples, the detected leaks) and
returns a :class:`Suggestion` only when the technique applies: not mixed precision for a run
that is already 16-bit, not checkpointing when activations are a small share, not sharding on
one process. Savings are bytes of the training peak; the list is ranked by saving.

The share thresholds compare against the tensor total of the breakdown (parameters, gradients,
optimizer state, activations; plus ``other`` on CUDA, where it is allocator bytes of tensors).
On CPU ``other`` is host RSS of the interpreter and libraries, which no technique changes.

One module per technique (its rule and the helpers only it uses); :mod:`.facts` holds what they
share. This module runs them in order and ranks the result.
"""

from __future__ import annotations

from typing import Callable

from memscope.analysis.frameworks import framework_how, framework_of
from memscope.analysis.leaks import suggestions as leak_suggestions
from memscope.analysis.suggestions.allocator_config import allocator_config
from memscope.analysis.suggestions.checkpointing import CheckpointPlan, activation_checkpointing, checkpoint_plan
from memscope.analysis.suggestions.efficient_attention import efficient_attention
from memscope.analysis.suggestions.facts import MIN_SAVING, Facts, Suggestion, gather
from memscope.analysis.suggestions.fit_plan import fit_plan
from memscope.analysis.suggestions.gradient_accumulation import gradient_accumulation
from memscope.analysis.suggestions.lighter_optimizer import lighter_optimizer
from memscope.analysis.suggestions.mixed_precision import mixed_precision
from memscope.analysis.suggestions.no_grad import no_grad
from memscope.analysis.suggestions.optimizer_offload import optimizer_offload
from memscope.analysis.suggestions.quantization import quantization
from memscope.analysis.suggestions.selective_checkpointing import selective_checkpointing
from memscope.analysis.suggestions.sharding import sharding
from memscope.analysis.suggestions.single_precision import single_precision
from memscope.analysis.summary import RunSummary, summarize
from memscope.analysis.unexplained import suggestion as unexplained_suggestion
from memscope.analysis.workers import suggestion as workers_suggestion
from memscope.store.reader import RunReader

__all__ = ["CheckpointPlan", "Facts", "RULES", "Suggestion", "checkpoint_plan", "checkpoint_plan_for", "gather",
           "suggest", "suggest_for"]

RULES: list[Callable[[Facts], list[Suggestion]]] = [
    no_grad, single_precision, mixed_precision, activation_checkpointing, gradient_accumulation, efficient_attention,
    lighter_optimizer, optimizer_offload, sharding, quantization, allocator_config, fit_plan,
]


def suggest(reader: RunReader, summary: RunSummary | None = None) -> list[Suggestion]:
    """The techniques that apply to this run, biggest estimated saving first."""
    s = summary if summary is not None else summarize(reader)
    facts = gather(reader, s)
    out: list[Suggestion] = []
    if facts is not None:
        for rule in RULES:
            out.extend(x for x in rule(facts) if x.estimated_saving_bytes >= MIN_SAVING)
        _framework_first(out, framework_of(reader), facts)
    out.extend(Suggestion(**d) for d in leak_suggestions(s.leaks, s.steps))
    out.extend(selective_checkpointing(reader, facts))  # a profiled block only
    if s.unexplained is not None:
        out.append(Suggestion(**unexplained_suggestion(s.unexplained, s.steps)))
    if s.workers is not None:
        out.append(Suggestion(**workers_suggestion(s.workers)))
    out.sort(key=lambda x: (-x.estimated_saving_bytes, x.technique))
    return out


def _framework_first(items: list[Suggestion], framework: str | None, f: Facts) -> None:
    """Put the framework's own switch before each plain-PyTorch change it replaces."""
    if framework is None or f.closure_forwards:
        return  # a closure optimizer (LBFGS) is a plain loop's: the generic advice is its own
    micro = max(1, f.micro_batches or 1)
    for x in items:
        way = framework_how(framework, x.technique, micro)
        if way:
            x.how = f"{way}; in plain PyTorch: {x.how}"


def checkpoint_plan_for(reader: RunReader, summary: RunSummary | None = None) -> CheckpointPlan | None:
    """The checkpointing plan the estimator models for this run (what-if trials apply it)."""
    s = summary if summary is not None else summarize(reader)
    facts = gather(reader, s)
    return checkpoint_plan(facts) if facts is not None else None


def suggest_for(summary: RunSummary) -> list[Suggestion]:
    """:func:`suggest` for a summary already made, reading its run file again (reports get only
    the summary; the file is opened read-only, safe while the run is still written)."""
    with RunReader(summary.path) as reader:
        return suggest(reader, summary)

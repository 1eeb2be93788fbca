"""Issue #23 item 4: every suggestion's figure within 25% of what ``memscope whatif`` measures, or
no figure. Three scripts of benchmarks/advice_accuracy.py's matrix, the ones whose figures were
off before: ng-video-lecture (per-head projections of one fp32 input, attention dropout 0.2 on
CPU) and a peft LoRA GPT-2 (the transformers loss in float32, SDPA attention), off by 2x to 8x;
nanoGPT (scaled_dot_product_attention with dropout 0.2: the math kernel on CPU), told to switch
to SDPA and its mixed precision +81%. gradient_accumulation against a real accumulation loop
(half the batch, two micro-batches a step) on those three, and on word_language_model, whose
14.7 MiB of gradients, freed before its forward, stay live across the micro-batches. The runs
are made once and shared by the assertions; the whole table is the benchmark's. Each script is
also attached plainly (``memscope attach --headless``, defaults: one step's live-tensor peak),
and that report's figures are held to the same measurements."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any
from unittest import mock

import pytest

from conftest import ROOT
from memscope.analysis.suggestions import suggest
from memscope.analysis.suggestions.facts import MIN_SAVING, gather
from memscope.analysis.whatif import TOLERANCE
from memscope.store.reader import RunReader

_spec = importlib.util.spec_from_file_location("advice_accuracy", ROOT / "benchmarks" / "advice_accuracy.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules["advice_accuracy"] = bench  # its dataclasses look their module up
_spec.loader.exec_module(bench)

TRIED = ("mixed_precision", "activation_checkpointing")  # what these two runs are suggested
CASES = ("ng-video-lecture", "peft LoRA GPT-2", "nanoGPT")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500),  # fifteen runs, shared by the tests
              pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                 reason="needs the integrations extra")]


def _without_peak(db: str) -> dict[str, int]:
    """The plain run's figures as its report gave them before a plain run measured its
    live-tensor peak: the same run file, the peak left unread."""
    def gather_no_peak(reader: Any, s: Any) -> Any:
        f = gather(reader, s)
        if f is not None:
            f.tensor_peak = f.peak_grads = None
        return f

    with RunReader(db) as reader, mock.patch("memscope.analysis.suggestions.gather", gather_no_peak):
        return {s.technique: s.estimated_saving_bytes for s in suggest(reader)}


def _plain(case: Any, workdir: str) -> tuple[list[Any], dict[str, int]]:
    bench.record_plain(case, workdir)
    return bench.plain_rows(case, workdir), _without_peak(bench._db(case, workdir, "plain"))


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, ...]]:
    """name -> (rows of the table, the baseline's suggestions, the plain attach run's rows, its
    figures without the peak)."""
    out = {}
    for name in CASES:
        case = bench.case(name)
        workdir = str(tmp_path_factory.mktemp("advice"))
        bench.record(case, workdir, TRIED)
        with RunReader(bench._db(case, workdir, "baseline")) as reader:
            suggestions = suggest(reader)
        out[name] = (bench.analyse(case, workdir, TRIED), suggestions, *_plain(case, workdir))
    return out


@pytest.fixture(scope="module")
def word_lm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    """word_language_model's rows (its baseline, a mixed-precision trial, the accumulation run),
    its baseline's suggestions, the plain attach run's rows and its figures without the peak."""
    case = bench.case("word_language_model")
    workdir = str(tmp_path_factory.mktemp("advice"))
    bench.record(case, workdir, ("mixed_precision",))
    with RunReader(bench._db(case, workdir, "baseline")) as reader:
        suggestions = suggest(reader)
    return bench.analyse(case, workdir, ("mixed_precision",)), suggestions, *_plain(case, workdir)


def _within(r: Any) -> None:
    """Suggested and measured (the comparison is not vacuous), and within 25%."""
    assert r.suggested is not None and r.measured is not None and r.measured >= MIN_SAVING, r
    assert abs(r.suggested - r.measured) <= TOLERANCE * r.measured, r


@pytest.mark.parametrize("name", CASES)
def test_gradient_accumulation_is_within_25_percent_of_an_accumulation_loop(matrix: Any, name: str) -> None:
    """The figure counts what scales with the micro-batch: the activations and the working
    tensors beside them (LoRA GPT-2: the float32 logits and loss, as large as its activations;
    the activations alone were -50%)."""
    _within({r.technique: r for r in matrix[name][0]}["gradient_accumulation"])


def test_gradient_accumulation_keeps_the_gradients_a_script_frees(word_lm: Any) -> None:
    """word_language_model zeroes its gradients (to None) before the forward: at its peak none
    is live, while accumulating keeps them through the second micro-batch. Its figure takes them
    off: without, it is the smaller batch's saving (42.7 MiB), +53% of the loop's 27.9 MiB."""
    rows, suggestions = word_lm[:2]
    _within({r.technique: r for r in rows}["gradient_accumulation"])
    acc = {s.technique: s for s in suggestions}["gradient_accumulation"]
    assert "of gradients the script frees before its forward stay live" in acc.evidence, acc.evidence


@pytest.mark.parametrize("name", [*CASES, "word_language_model"])
def test_a_plain_runs_gradient_accumulation_is_within_25_percent(matrix: Any, word_lm: Any, name: str) -> None:
    """``memscope attach`` at its defaults measures one step's live-tensor peak: its report
    counts the working set beside the activations as the whatif baseline's does, and the
    gradients the script frees before its peak. Without the peak the LoRA GPT-2's figure was
    half the activations, -50%; word_language_model's -24%."""
    _, _, plain, before = word_lm if name == "word_language_model" else matrix[name]
    r = {r.technique: r for r in plain}["gradient_accumulation"]
    _within(r)
    if name == "peft LoRA GPT-2":  # the case the peak is for: not vacuous
        assert before["gradient_accumulation"] < 0.6 * r.measured, (before, r)


def _error(figure: int, measured: int) -> float:
    return abs(figure - measured) / measured


@pytest.mark.parametrize("name", [*CASES, "word_language_model"])
def test_a_plain_runs_other_figures_are_within_25_percent(matrix: Any, word_lm: Any, name: str) -> None:
    """The working set the plain run now knows also enters mixed precision and checkpointing.
    Each figure the whatif baseline gives and a trial measures, the plain report gives too,
    within 25% of the measurement (the LoRA GPT-2's mixed_precision was +41%: with an
    inventory, the bf16 copies of trainable weight matrices only were counted, where the frozen
    ones are copied too)."""
    rows, _, plain, before = word_lm if name == "word_language_model" else matrix[name]
    by = {r.technique: r for r in plain}
    checked = [r.technique for r in rows if r.suggested is not None and r.measured is not None
               and r.technique != "gradient_accumulation"]
    assert checked, rows
    for t in checked:
        r = by[t]
        assert r.suggested is not None and r.measured is not None and r.measured >= MIN_SAVING, r
        assert _error(r.suggested, r.measured) <= TOLERANCE, (r, before[t])


@pytest.mark.parametrize("name", CASES)
def test_each_figure_is_within_25_percent_of_the_measured_saving(matrix: Any, name: str) -> None:
    rows = {r.technique: r for r in matrix[name][0]}
    for t in TRIED:
        _within(rows[t])


def test_no_attention_figure_where_sdpa_saves_nothing(matrix: Any) -> None:
    """ng-video-lecture on CPU: dropout on the scores keeps SDPA on its math kernel. The same
    script through scaled_dot_product_attention saves less than a suggestion's minimum, and no
    efficient_attention figure is given."""
    rows = {r.technique: r for r in matrix["ng-video-lecture"][0]}
    r = rows["efficient_attention"]
    assert r.measured is not None and r.measured < MIN_SAVING, r
    assert r.suggested is None, r


def test_a_model_already_on_sdpa_is_not_told_to_switch(matrix: Any) -> None:
    """nanoGPT calls scaled_dot_product_attention with dropout 0.2: on CPU its math kernel stores
    the scores, and switching to SDPA saves nothing (the benchmark's measured 0). The profile saw
    that kernel: no efficient_attention figure, and the mixed-precision evidence counts what the
    kernel saves as fp32."""
    rows = {r.technique: r for r in matrix["nanoGPT"][0]}
    r = rows["efficient_attention"]
    assert r.measured == 0 and r.suggested is None, r
    by = {s.technique: s for s in matrix["nanoGPT"][1]}
    assert "scaled_dot_product_attention's math kernel" in by["mixed_precision"].evidence
    assert "h.0.attn" in by["mixed_precision"].evidence


def test_a_transformers_model_is_told_gradient_checkpointing_enable(matrix: Any) -> None:
    by = {s.technique: s for s in matrix["peft LoRA GPT-2"][1]}
    how = by["activation_checkpointing"].how
    assert "model.gradient_checkpointing_enable(" in how and "in the parent's forward" not in how
    assert "float32 loss" in by["mixed_precision"].evidence
    plain = {s.technique: s for s in matrix["ng-video-lecture"][1]}  # not a transformers model
    assert "gradient_checkpointing_enable" not in plain["activation_checkpointing"].how

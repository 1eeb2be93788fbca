"""Every suggestion's figure against what applying the technique measures (the exact live-tensor
peak), within 20% (issue 36 item 6; issue #23 item 4 asked 25%), or no figure where the saving is
below a suggestion's minimum.

Third-party scripts (benchmarks/advice_accuracy.py's matrix): ng-video-lecture (per-head
projections of one fp32 input, attention dropout 0.2 on CPU), a peft LoRA GPT-2 (the
transformers loss in float32, SDPA attention), nanoGPT (scaled_dot_product_attention with
dropout 0.2: the math kernel on CPU); mixed_precision and activation_checkpointing measured by
``memscope whatif``, gradient_accumulation by a real accumulation loop (half the batch, two
micro-batches a step) on those three and on word_language_model, whose 14.7 MiB of gradients,
freed before its forward, stay live across the micro-batches; efficient_attention by the same
script through SDPA. Each script is also attached plainly (``memscope attach --headless``,
defaults: one step's live-tensor peak), and that report's figures are held to the same
measurements.

The project's scripts (``PROJECT``): activation_checkpointing, selective_checkpointing,
mixed_precision and lighter_optimizer through ``memscope whatif`` on two models of issue 36 item
6 (tests/scripts/ckpt_peak.py: attention scores, CNN blocks), tiny_gpt, resnet, the
checkpoint_sequential models cnn.py and mlp.py, wide_adam; the whatif baseline's figure and a
plain attach run's. mixed_precision on pytorch/examples' mnist and dcgan
(tests/scripts/conv_examples.py): a step peaking in the optimizer's step, a GAN's working set.
single_precision (mlp.py in float64 against float32) and efficient_attention (gpt.py naive
against SDPA) by the changed script's plain run. no_grad, suggested after an evaluation ran
out of memory, is measured at the failing moment: its figure is an upper bound (see its test)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import pytest

from conftest import ROOT, memscope
from shared_runs import shared_attach
from memscope.analysis.suggestions import suggest
from memscope.analysis.suggestions.facts import MIN_SAVING, gather
from memscope.analysis.whatif import measure
from memscope.store.reader import RunReader
from memscope.units import human_bytes

_spec = importlib.util.spec_from_file_location("advice_accuracy", ROOT / "benchmarks" / "advice_accuracy.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules["advice_accuracy"] = bench  # its dataclasses look their module up
_spec.loader.exec_module(bench)

ACCURACY = 0.20  # issue 36 item 6: every figure within 20% of what applying the technique measures
TRIED = ("mixed_precision", "activation_checkpointing")  # what these two runs are suggested
CASES = ("ng-video-lecture", "peft LoRA GPT-2", "nanoGPT")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # fifteen runs, shared by the tests


def _needs_transformers() -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs the integrations extra")


def _without_peak(db: str) -> dict[str, int]:
    """The plain run's figures as its report gave them before a plain run measured its
    live-tensor peak: the same run file, the peak left unread."""
    def gather_no_peak(reader: Any, s: Any) -> Any:
        f = gather(reader, s)
        if f is not None:
            f.tensor_peak = f.peak_grads = f.step_peaks = None  # step_peaks: the same peak, per side
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
    _needs_transformers()
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
    _needs_transformers()
    case = bench.case("word_language_model")
    workdir = str(tmp_path_factory.mktemp("advice"))
    bench.record(case, workdir, ("mixed_precision",))
    with RunReader(bench._db(case, workdir, "baseline")) as reader:
        suggestions = suggest(reader)
    return bench.analyse(case, workdir, ("mixed_precision",)), suggestions, *_plain(case, workdir)


def _within(r: Any) -> None:
    """Suggested and measured (the comparison is not vacuous), and within 20%."""
    assert r.suggested is not None and r.measured is not None and r.measured >= MIN_SAVING, r
    assert abs(r.suggested - r.measured) <= ACCURACY * r.measured, r


@pytest.mark.parametrize("name", CASES)
def test_gradient_accumulation_is_within_20_percent_of_an_accumulation_loop(matrix: Any, name: str) -> None:
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
def test_a_plain_runs_gradient_accumulation_is_within_20_percent(matrix: Any, word_lm: Any, name: str) -> None:
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
def test_a_plain_runs_other_figures_are_within_20_percent(matrix: Any, word_lm: Any, name: str) -> None:
    """The working set the plain run now knows also enters mixed precision and checkpointing.
    Each figure the whatif baseline gives and a trial measures, the plain report gives too,
    within 20% of the measurement (the LoRA GPT-2's mixed_precision was +41%: with an
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
        assert _error(r.suggested, r.measured) <= ACCURACY, (r, before[t])


@pytest.mark.parametrize("name", CASES)
def test_each_figure_is_within_20_percent_of_the_measured_saving(matrix: Any, name: str) -> None:
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
    # selective checkpointing too: blocks wrapped by hand would run with the KV cache on
    sac = by["selective_checkpointing"].how
    assert "gradient_checkpointing_enable(" in sac and '"context_fn": functools.partial(' in sac, sac
    assert "use_cache = False" in sac and "wrap each block" not in sac, sac
    assert plain["selective_checkpointing"].how.startswith("wrap each block"), plain["selective_checkpointing"]


def test_selective_checkpointing_of_a_transformers_model_is_measured(tmp_path: Path) -> None:
    """peft's LoRA GPT-2 with its blocks wrapped by hand: the model's KV cache, on in training,
    grows between a block's forward and its recompute, which then runs other ops, and SAC's replay
    failed ("aten.slice.Tensor encountered during backward but not found in storage"): the trial
    exited 1, as the advice followed by hand would. The trial turns the cache off, as
    ``gradient_checkpointing_enable`` does, and measures the estimate within 20%."""
    _needs_transformers()
    out = memscope("whatif", "--json", "--steps", "2", "--db-dir", str(tmp_path), "--try",
                   "selective_checkpointing", str(ROOT / "tests" / "thirdparty" / "lora_gpt2.py"), "1000")
    assert out.returncode == 0, out.stderr[-3000:]
    trial = json.loads(out.stdout)["trials"][0]
    assert trial["status"] == "finished" and trial["how"][0]["use_cache_off"] is True, trial
    assert trial["measured_by"] == "tensor_peak" and trial["estimated_saving_bytes"], trial
    assert abs(trial["estimate_error"]) <= ACCURACY, trial
    from memscope.report.sac_code import policy_code  # the plan as code says it to a hand wrapper

    assert "model.config.use_cache = False" in policy_code(["aten.addmm"], "transformer.h", "GPT2Block")


# the project's scripts: name -> (script and arguments, whatif's trials, the plain attach run
# (options, command) shared through tests/shared_runs.py: test_suggestions reads mlp and wide_adam)
PROJECT: dict[str, tuple[list[str], tuple[str, ...], tuple[list[str], list[str]]]] = {
    # two blocks of naive attention over 384 tokens, width 16: the N x N scores (and their
    # gradients in backward) set the peak; with checkpointing the last block's recompute does
    "attention scores": (["tests/scripts/ckpt_peak.py", "attention"],
                         ("activation_checkpointing", "mixed_precision", "selective_checkpointing"),
                         ([], ["tests/scripts/ckpt_peak.py", "attention", "--steps", "4"])),
    # six conv-BatchNorm-ReLU blocks after a full-resolution stem: each block saves its output,
    # which stays alive as the next block's checkpointed input
    "CNN blocks": (["tests/scripts/ckpt_peak.py", "cnn"], ("activation_checkpointing", "mixed_precision"),
                   ([], ["tests/scripts/ckpt_peak.py", "cnn", "--steps", "4"])),
    "tiny_gpt": (["examples/tiny_gpt.py"],
                 ("activation_checkpointing", "mixed_precision", "lighter_optimizer", "selective_checkpointing"),
                 ([], ["examples/tiny_gpt.py", "--steps", "8"])),
    # residual blocks ending in a ReLU of their own code: the first block's input was saved by
    # the stem, the others' by the block before
    "resnet": (["examples/scenarios/resnet.py", "--batch", "16"], ("activation_checkpointing",),
               ([], ["examples/scenarios/resnet.py", "--batch", "16", "--steps", "4"])),
    # checkpoint_sequential: a 3-channel image first, BatchNorm, pooling between the segments
    "cnn.py": (["examples/scenarios/cnn.py"], ("activation_checkpointing",),
               ([], ["examples/scenarios/cnn.py", "--steps", "4"])),
    # checkpoint_sequential of Linear / ReLU: a segment beginning with a ReLU saves no input, so
    # its checkpoint holds one the baseline let go
    "mlp": (["examples/scenarios/mlp.py"], ("activation_checkpointing",),
            (["--layers-every", "1"], ["examples/scenarios/mlp.py"])),
    "wide_adam": (["examples/scenarios/wide_adam.py"], ("lighter_optimizer",),
                  (["--layers-every", "1"], ["examples/scenarios/wide_adam.py"])),
}


def _figures(db: str | Path) -> dict[str, Any]:
    with RunReader(str(db)) as reader:
        return {s.technique: s for s in suggest(reader)}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """name -> ``memscope whatif --json`` of the script (two steps: step 0 warms up, step 1 is
    measured), with the suggestions of its baseline (``"baseline"``) and of the plain attach
    run at the defaults (``"plain"``) by technique; each made once, when a test first asks."""
    made: dict[str, dict[str, Any]] = {}

    def get(name: str) -> dict[str, Any]:
        if name not in made:
            command, tried, (options, plain) = PROJECT[name]
            work = tmp_path_factory.mktemp("peak")
            done = memscope("whatif", "--json", "--steps", "2", "--db-dir", str(work), "--try", ",".join(tried),
                            *command, timeout=600)
            assert done.returncode == 0, done.stderr[-2000:]
            doc = json.loads(done.stdout)
            db, ran = shared_attach(tmp_path_factory, options, plain, timeout=300)
            assert ran.returncode == 0, ran.stderr[-2000:]
            doc["figures"] = {"baseline": _figures(doc["baseline"]["db"]), "plain": _figures(db)}
            made[name] = doc
        return made[name]
    return get


def _rows(doc: dict[str, Any]) -> list[tuple[str, str, int | None, int]]:
    """(run, technique, figure, measured saving) for each trial and each run's figure."""
    rows = []
    for t in doc["trials"]:
        assert t["applied"] and t["measured_by"] == "tensor_peak", t
        for run in ("baseline", "plain"):
            s = doc["figures"][run].get(t["technique"])
            rows.append((run, t["technique"], s.estimated_saving_bytes if s else None, t["measured_saving_bytes"]))
    return rows


@pytest.mark.parametrize("name", PROJECT)
def test_every_figure_is_within_20_percent_of_whatif(project: Any, name: str) -> None:
    """Each technique whatif tried: the figure of its baseline (what whatif sets beside the
    measurement) and of a plain attach run of the same script at the defaults (what ``memscope
    report`` tells a user) within 20% of the measured saving, where it is a suggestion's worth
    (MIN_SAVING); no figure where it is not (tiny_gpt's AdamW state, 0.5 MiB). Before issue 36
    item 6 checkpointing's figure counted the saved activations removed: attention scores -30%,
    CNN blocks +40%, resnet +11%; the plain runs' selective_checkpointing figure was the
    activation bytes the plan keeps less (attention scores +84%, tiny_gpt +18%)."""
    checked = 0
    for run, technique, figure, measured in _rows(project(name)):
        if measured < MIN_SAVING:
            assert figure is None, (run, technique, figure, measured)
            continue
        assert figure is not None and abs(figure - measured) <= ACCURACY * measured, (run, technique, figure, measured)
        checked += 1
    assert checked, project(name)["trials"]


def test_checkpointing_states_the_peak_after_with_its_parts(project: Any) -> None:
    """The figure is the peak now less the modelled peak once checkpointed: the evidence and
    ``report --json``'s ``peak`` say both, where the new peak is and its parts, which add up to
    it. A whatif baseline measured the blocks' backward; a plain run's is modelled."""
    for name in ("attention scores", "CNN blocks"):
        for run, timeline in (("baseline", "measured"), ("plain", "modelled")):
            s = project(name)["figures"][run]["activation_checkpointing"]
            peak = s.peak
            assert peak["timeline"] == timeline, peak
            assert peak["before_bytes"] - peak["after_bytes"] == s.estimated_saving_bytes
            assert sum(p["bytes"] for p in peak["parts"]) == peak["after_bytes"]
            assert f"becomes {human_bytes(peak['after_bytes'])}" in s.evidence and peak["at"] in s.evidence
    # the attention's new peak is its last block's recompute: its scores are live again
    peak = project("attention scores")["figures"]["plain"]["activation_checkpointing"].peak
    assert peak["at"] == "blocks.1's recompute", peak
    rerun = next(p["bytes"] for p in peak["parts"] if p["part"].startswith("its recompute"))
    assert rerun > 0.6 * peak["after_bytes"], peak
    seq = project("cnn.py")["figures"]["plain"]["activation_checkpointing"]
    assert "checkpoint_sequential" in seq.how and "segment" in seq.peak["at"], seq.peak


def test_selective_checkpointing_is_the_same_model_as_whatifs_prediction(project: Any) -> None:
    """One model: the selective_checkpointing figure of a whatif baseline is the baseline's peak
    less the peak whatif predicts for the plan it tries (memscope.cli.whatif_selective), and
    whole-block checkpointing's is the same model's for no op kept."""
    for name in ("attention scores", "tiny_gpt"):
        doc = project(name)
        sel = doc["selective_checkpointing"]
        figure = doc["figures"]["baseline"]["selective_checkpointing"].estimated_saving_bytes
        assert figure == sel["baseline_peak_bytes"] - sel["predicted_peak_bytes"], sel
        whole = next(pt for pt in sel["curve"] if pt["label"] == "whole-block")
        ckpt = doc["figures"]["baseline"]["activation_checkpointing"].estimated_saving_bytes
        assert ckpt == sel["baseline_peak_bytes"] - whole["predicted_peak_bytes"], (ckpt, whole)



# changes whatif cannot make to an unchanged script: technique -> (the plain attach run that is
# told it, the same script with the change made), shared with test_suggestions (the mlp pair)
CHANGED = {
    "single_precision": ((["--layers-every", "1"], ["examples/scenarios/mlp.py", "--dtype", "fp64"]),
                         (["--layers-every", "1"], ["examples/scenarios/mlp.py"])),
    "efficient_attention": (([], ["examples/scenarios/gpt.py", "--steps", "4", "--seq", "128"]),
                            ([], ["examples/scenarios/gpt.py", "--sdpa", "--steps", "4", "--seq", "128"])),
}


def _tensor_peak(db: str | Path) -> int:
    with RunReader(str(db)) as reader:
        peak = measure(reader).tensor_peak
    assert peak is not None, db
    return peak


@pytest.mark.parametrize("technique", CHANGED)
def test_a_change_whatif_cannot_make_is_within_20_percent_of_the_changed_script(
        tmp_path_factory: pytest.TempPathFactory, technique: str) -> None:
    """float64 -> float32 (mlp.py --dtype fp64, told single_precision) and naive attention ->
    scaled_dot_product_attention (gpt.py, told efficient_attention): the figure against the
    live-tensor peak of the same script with the change made (each plain run measures one step)."""
    runs = []
    for options, command in CHANGED[technique]:
        db, ran = shared_attach(tmp_path_factory, options, command, timeout=300)
        assert ran.returncode == 0, ran.stderr[-2000:]
        runs.append(db)
    s = _figures(runs[0]).get(technique)
    measured = _tensor_peak(runs[0]) - _tensor_peak(runs[1])
    assert measured >= MIN_SAVING and s is not None, (s, measured)
    assert abs(s.estimated_saving_bytes - measured) <= ACCURACY * measured, (s.estimated_saving_bytes, measured)

def _live_at_the_failing_layer(grad: bool) -> int:
    """Live tensor bytes (memscope's exact counter, in this process) when tests/scripts/
    advice_cases.py's evaluation reaches the layer that fails there, its model rebuilt here,
    with autograd on or under no_grad."""
    import torch
    import torch.nn as nn

    from memscope.agent.collectors.tensor_peak import TensorPeak

    seen: list[int] = []
    counter = TensorPeak()

    class Failing(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(counter.total)
            return x

    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), Failing(),
                          nn.Linear(1024, 10)).eval()
    x = torch.randn(4096, 256)
    counter.begin(0, lambda: [x, *model.parameters()])
    try:
        with torch.set_grad_enabled(grad):
            model(x)
    finally:
        counter.end()
    return seen[0]


def test_no_grads_figure_is_an_upper_bound_at_the_failing_moment(tmp_path_factory: pytest.TempPathFactory) -> None:
    """no_grad is suggested after an evaluation with autograd on ran out of memory: whatif
    cannot run it (its baseline fails), so the saving is measured here, at the moment of the
    failure: the live bytes there with autograd on less under no_grad. The figure is what
    autograd had saved then (the model's input and both ReLUs' outputs: 36 MiB); no_grad frees
    16 MiB of it then: the model's input and the failing layer's input are live under no_grad
    too, and which tensors they were is not recorded. Not within 20%, for that reason: the
    figure is an upper bound, and its evidence says so ("up to")."""
    db, ran = shared_attach(tmp_path_factory, [], ["tests/scripts/advice_cases.py", "eval"])
    assert ran.returncode == 1, ran.stderr[-2000:]
    s = _figures(db)["no_grad"]
    measured = _live_at_the_failing_layer(True) - _live_at_the_failing_layer(False)
    assert measured == 4096 * 1024 * 4  # the first ReLU's output: nothing else is freed then
    assert s.estimated_saving_bytes >= measured and "up to that much is freed at the failing moment" in s.evidence


@pytest.fixture(scope="module")
def conv_examples(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Any, dict[str, Any], Any]]:
    """(arguments of tests/scripts/conv_examples.py) -> (``memscope whatif --try`` (exit status,
    JSON), the baseline's figures, its facts): two steps, step 1 measured; mixed_precision
    tried, and on mnist at its default batch lighter_optimizer too."""
    made: dict[tuple[str, ...], tuple[Any, dict[str, Any], Any]] = {}

    def get(*argv: str) -> tuple[Any, dict[str, Any], Any]:
        if argv not in made:
            tried = "mixed_precision,lighter_optimizer" if argv == ("mnist",) else "mixed_precision"
            work = tmp_path_factory.mktemp(f"conv-{'-'.join(argv)}")
            done = memscope("whatif", "--json", "--steps", "2", "--db-dir", str(work), "--try", tried,
                            "tests/scripts/conv_examples.py", *argv, timeout=300)
            doc = json.loads(done.stdout)
            with RunReader(doc["baseline"]["db"]) as reader:
                from memscope.analysis.summary import summarize

                facts = gather(reader, summarize(reader))
            made[argv] = ((done.returncode, done.stderr), doc, facts)
        return made[argv]
    return get


def _trial(doc: dict[str, Any], technique: str) -> dict[str, Any]:
    trial = next(t for t in doc["trials"] if t["technique"] == technique)
    assert trial["applied"] and trial["status"] == "finished" and trial["measured_by"] == "tensor_peak", trial
    return trial


def test_mixed_precision_saves_nothing_at_a_peak_in_the_optimizers_step(conv_examples: Any) -> None:
    """pytorch/examples mnist (Adadelta, batch 16): the step peaks in the optimizer's step, where
    the update's temporaries of fc1's weight sit beside the states and backward has freed every
    activation. Autocast changes nothing live there: whatif measures a few bytes, and no figure
    is given (it was 2.48 MiB on pytorch/examples, 2.24 MiB here: the temporaries halved as the
    working set of 16-bit ops)."""
    (rc, err), doc, facts = conv_examples("mnist")
    assert rc == 0, err[-2000:]
    trial = _trial(doc, "mixed_precision")
    assert facts.peak_phase == "optimizer" and abs(trial["measured_saving_bytes"]) < MIN_SAVING, trial
    assert trial["estimated_saving_bytes"] is None  # the figure whatif sets beside it: the baseline's
    assert "mixed_precision" not in _figures(doc["baseline"]["db"])


def test_mixed_precision_does_not_halve_a_working_set_beside_other_models(conv_examples: Any) -> None:
    """pytorch/examples dcgan (two Adam optimizers, a DataLoader, the generator's sample on fixed
    noise with autograd on): the step peaks with a batch of the DataLoader and a second graph
    of the generator live beside the states and saved activations. Whose that working set is
    is not known: not halved. Halved, it made 1.88 MiB of a figure of 2.70 MiB here (2.19 of
    2.83 MiB on pytorch/examples), where a profiler count of the same step without memscope
    (the sample, then a batch) measures 0.85 MiB less with both models under autocast, 96 KB
    more with the discriminator alone: below a suggestion's worth either way. The trial puts
    both models under autocast and feeds its BCELoss the bfloat16 output in float32 (what the
    advice says such a script needs): it measures 0.94 MiB, within 20% of that count (it failed
    at step 0 before, and its RSS once read as a 16.34 MiB saving)."""
    (rc, err), doc, facts = conv_examples("dcgan")
    assert rc == 0, err[-2000:]
    trial = _trial(doc, "mixed_precision")
    assert len([h for h in trial["how"] if h.get("device")]) == 2 and any(h.get("bce_float") for h in trial["how"])
    profiled = 0.85 * (1 << 20)  # both models under autocast, counted without memscope
    assert abs(trial["tensor_peak_saving_bytes"] - profiled) <= 0.2 * profiled, trial
    assert trial["tensor_peak_saving_bytes"] < MIN_SAVING and not trial["suggested"], trial
    assert facts.peak_phase == "other" and facts.tensor_peak - facts.parameters - facts.gradients \
        - facts.optimizer_state - facts.activations >= MIN_SAVING, facts  # a working set there to halve
    assert trial["estimated_saving_bytes"] is None and "mixed_precision" not in _figures(doc["baseline"]["db"])


# tests/scripts/conv_examples.py's mnist at two batches: (arguments, the technique the step's
# other peak bounds)
CLOSE_PEAKS = {"optimizer's step above backward": (("mnist",), "lighter_optimizer"),
               "backward above the optimizer's step": (("mnist", "24"), "mixed_precision")}


@pytest.mark.parametrize("case", CLOSE_PEAKS)
def test_a_saving_stops_at_the_steps_other_peak(conv_examples: Any, case: str) -> None:
    """The mnist shape (Adadelta, as pytorch/examples has it): the step peaks in backward
    (activations, gradients, states) and in the optimizer's step (9.0 MiB of the update's
    temporaries beside the states), close together. A technique that lowers one peak lowers the
    step's only down to the other, which the run measured apart (the ``tensor_peak`` event's
    ``phases``). Batch 16: the optimizer's step is 1.0 MiB above backward; SGD's one state less
    and no temporaries took 13.6 MiB off it, and the figure, state plus temporaries off the
    peak, was 7.73 MiB (+39% of the 5.58 MiB measured; +39% on the Adam variant): backward
    less one state bounds it. Batch 24: backward is 3.03 MiB above the optimizer's step;
    autocast takes 3.76 MiB off it, the figure was 3.76 MiB (+24%; 2.75 MiB at batch 20 where
    1.02 MiB were measured, +171%); now 3.03 MiB, measured 3.03 MiB."""
    argv, technique = CLOSE_PEAKS[case]
    (rc, err), doc, facts = conv_examples(*argv)
    assert rc == 0, err[-2000:]
    p = facts.step_peaks
    assert p is not None, facts
    measured = _trial(doc, technique)["measured_saving_bytes"]
    s = _figures(doc["baseline"]["db"])[technique]
    assert measured >= MIN_SAVING and abs(s.estimated_saving_bytes - measured) <= ACCURACY * measured, \
        (s.estimated_saving_bytes, measured, s.evidence)
    if technique == "mixed_precision":  # capped by the optimizer's step: said so
        assert p.model > p.optimizer > p.model - 4 * MIN_SAVING, p
        assert "the step's peak falls to it, not below" in s.evidence, s.evidence
    else:  # the optimizer's step peaks, its temporaries more than the distance to backward
        assert p.model < p.optimizer < p.model + 2 * MIN_SAVING and p.optimizer_temporaries > 4 * MIN_SAVING, p
        assert "the peak becomes" in s.evidence and "in its forward and backward" in s.evidence, s.evidence


def test_a_plain_runs_figures_stop_at_the_optimizers_peak(conv_examples: Any,
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    """What ``memscope report`` tells a user of the same script (a plain attach run, one step
    measured): mixed_precision against whatif's trial, and gradient_accumulation against the
    same script accumulating 2 micro-batches of 12 (its live-tensor peak), both within 20%.
    Backward's peak, 3.03 MiB above the optimizer step's, bounds both: accumulation's figure
    was 3.76 MiB where 2.78 MiB are measured (+36%); now 3.03 MiB (+9%)."""
    plain, ran = shared_attach(tmp_path_factory, [], ["tests/scripts/conv_examples.py", "mnist", "24"])
    assert ran.returncode == 0, ran.stderr[-2000:]
    micro, ran = shared_attach(tmp_path_factory, [], ["tests/scripts/conv_examples.py", "mnist", "24", "adadelta", "2"])
    assert ran.returncode == 0, ran.stderr[-2000:]
    figures = _figures(plain)
    measured = {"mixed_precision": _trial(conv_examples("mnist", "24")[1], "mixed_precision")["measured_saving_bytes"],
                "gradient_accumulation": _tensor_peak(plain) - _tensor_peak(micro)}
    for technique, saving in measured.items():
        s = figures[technique]
        assert saving >= MIN_SAVING and abs(s.estimated_saving_bytes - saving) <= ACCURACY * saving, \
            (technique, s.estimated_saving_bytes, saving)
        assert "the step's peak falls to it, not below" in s.evidence, s.evidence


def test_mixed_precision_says_what_bceloss_needs(conv_examples: Any) -> None:
    """A script whose loss is nn.BCELoss (pytorch/examples dcgan's): autocast's bfloat16 output
    makes its first step fail ("Found dtype Float but expected BFloat16") for a user who follows
    the advice as it was. The advice says what to change with it: BCEWithLogitsLoss, or BCELoss
    on ``output.float()``; whatif's trial does the latter and measures the figure (3.18 MB, the
    estimate to 0.02%; the trial failed before). Here on the mnist shape at batch 24, where the
    saving is worth suggesting; the same note comes with dcgan's advice wherever its figure is a
    suggestion's worth."""
    (rc, err), doc, _ = conv_examples("mnist", "24", "adadelta", "1", "bce")
    assert rc == 0, err[-2000:]
    trial = _trial(doc, "mixed_precision")
    assert any(h.get("bce_float") for h in trial["how"]) and trial["suggested"], trial
    assert abs(trial["estimate_error"]) <= 0.005, trial  # 0.02% measured: both count tensors exactly
    how = _figures(doc["baseline"]["db"])["mixed_precision"].how
    assert "nn.BCEWithLogitsLoss" in how and "`output.float()`" in how, how
    plain = _figures(conv_examples("mnist", "24")[1]["baseline"]["db"])["mixed_precision"].how
    assert "BCELoss" not in plain, plain  # only where the script has one

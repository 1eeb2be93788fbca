"""Suggestions: real training runs where the right techniques must be suggested and the wrong
ones not, with savings checked against the run's own measurements; the fragmentation rule on
run files holding allocator rows shaped like the agent's cuda_samples (CUDA only)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLES, ROOT, SCRIPTS, cli, memscope, report_json, torchrun
from shared_runs import shared_attach
from memscope.analysis.suggestions import Suggestion, checkpoint_plan, gather, suggest
from memscope.analysis.suggestions.facts import _working_set
from memscope.analysis.suggestions.gradient_accumulation import batch_scaled
from memscope.analysis.summary import summarize
from memscope.store.reader import RunReader
from memscope.store.schema import migrate

SCENARIOS = EXAMPLES / "scenarios"
ALL = {"mixed_precision", "activation_checkpointing", "gradient_accumulation", "efficient_attention",
       "lighter_optimizer", "optimizer_offload", "quantization", "sharding", "allocator_config",
       "fix_leak"}


def attach(db: Path, *cmd: str, options: tuple[str, ...] = ("--layers-every", "1")) -> Path:
    out = memscope("attach", "--headless", "--db", str(db), *options, *cmd, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    return db


def suggestions(db: Path) -> list[Suggestion]:
    with RunReader(db) as r:
        return suggest(r)


def by_technique(items: list[Suggestion]) -> dict[str, Suggestion]:
    return {s.technique: s for s in items}


def breakdown(db: Path) -> dict[str, int]:
    return report_json(db)["peak"]["breakdown"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Each scenario run once per session, on demand (tests/shared_runs.py: a file that attaches
    the same command reads the same run; the dashboard's LBFGS caption test reads mlp_lbfgs3)."""
    def get(name: str, *cmd: str, options: tuple[str, ...] = ("--layers-every", "1")) -> Path:
        command = [str(Path(c).relative_to(ROOT)) if c.startswith(f"{ROOT}/") else c for c in cmd]
        db, out = shared_attach(tmp_path_factory, list(options), command, timeout=240)
        assert out.returncode == 0, out.stderr[-2000:]
        return db
    return get


# -- real runs ------------------------------------------------------------------------------------

def test_fp32_mlp_dominated_by_activations(runs: Any) -> None:
    db = runs("mlp", str(SCENARIOS / "mlp.py"))
    items = suggestions(db)
    got = by_technique(items)
    assert {"mixed_precision", "activation_checkpointing", "gradient_accumulation"} <= set(got)
    # plain SGD, no attention, one process, no frozen weights, CPU, no leak
    assert not set(got) & {"efficient_attention", "lighter_optimizer", "optimizer_offload",
                           "sharding", "quantization", "allocator_config", "fix_leak"}
    bd = breakdown(db)
    acts = bd["activations"]
    assert acts > 0.7 * (bd["parameters"] + bd["gradients"] + bd["optimizer_state"] + acts)
    # the run measured one step's live-tensor peak: what scales with the batch is the
    # activations and the working set beside them (the output, the loss and its gradient)
    with RunReader(db) as r:
        f = gather(r, summarize(r))
    assert f is not None and f.tensor_peak is not None
    scaled, grads = batch_scaled(f)
    assert acts < scaled < 1.3 * acts
    assert got["gradient_accumulation"].estimated_saving_bytes == scaled - scaled // 2 - grads
    # Everything here turns bf16 under autocast except the script's fp32 batch, which the first
    # Linear saves as a new bf16 copy (half its bytes added, not saved): half the activations
    # less the whole batch, less the bf16 copies of the weight matrices (2 bytes per weight),
    # plus half the working set.
    weights = 8 * 128 * 128 + 128
    batch = 1024 * 128 * 4
    mp = got["mixed_precision"].estimated_saving_bytes
    assert abs(mp - (acts / 2 - batch - 2 * weights + _working_set(f) / 2)) < 0.02 * acts
    ckpt = got["activation_checkpointing"]
    assert "checkpoint_sequential(model" in ckpt.how  # single-layer children: wrap segments
    assert 0 < ckpt.estimated_saving_bytes < acts
    assert [s.estimated_saving_bytes for s in items] == sorted(
        (s.estimated_saving_bytes for s in items), reverse=True)


def test_whole_model_in_bf16_is_not_told_to_use_mixed_precision(runs: Any) -> None:
    db = runs("mlp_bf16", str(SCENARIOS / "mlp.py"), "--dtype", "bf16", "--batch", "4096")
    got = by_technique(suggestions(db))
    assert "mixed_precision" not in got
    # its activations still dominate: the other activation techniques still apply
    assert {"activation_checkpointing", "gradient_accumulation"} <= set(got)


def test_float64_model_is_told_float32_not_autocast(runs: Any) -> None:
    """autocast casts only float32 tensors: a float64 model would gain nothing from it."""
    db = runs("mlp_fp64", str(SCENARIOS / "mlp.py"), "--dtype", "fp64")
    got = by_technique(suggestions(db))
    assert "single_precision" in got and "mixed_precision" not in got
    bd = breakdown(db)
    states = bd["parameters"] + bd["gradients"] + bd["optimizer_state"]
    # every parameter and activation is float64: float32 halves them all
    assert abs(got["single_precision"].estimated_saving_bytes - (states + bd["activations"]) / 2) < 1024
    assert "float64" in got["single_precision"].evidence and ".double()" in got["single_precision"].how
    # the float32 model of the same script is told autocast, not float32
    assert "single_precision" not in by_technique(suggestions(runs("mlp", str(SCENARIOS / "mlp.py"))))


def test_lbfgs_closure_is_not_gradient_accumulation(runs: Any) -> None:
    """LBFGS evaluates the loss through a closure inside optimizer.step() (20 forwards a step):
    those are not micro-batches the script accumulates, and its history is optimizer state
    (lists of flat parameter copies), growing by design, never a leak."""
    db = runs("mlp_lbfgs", str(SCENARIOS / "mlp.py"), "--optimizer", "lbfgs", "--batch", "8192")
    report = report_json(db)
    n = report["hotspots_closure_forwards"]
    assert report["hotspots_micro_batches"] == n >= 2  # max_iter=20: fewer once it has converged
    bd = report["peak"]["breakdown"]
    assert bd["optimizer_state"] > 20 * bd["parameters"]  # old_dirs / old_stps lists counted
    assert report["leaks"] == [] and report["leak_check"]["verdict"] == "ok"
    got = by_technique(suggestions(db))
    assert "inside the closure" in got["gradient_accumulation"].how
    assert "already accumulates" not in got["gradient_accumulation"].how
    assert "history_size=10" in got["lighter_optimizer"].how
    assert got["lighter_optimizer"].estimated_saving_bytes == bd["optimizer_state"] - 22 * bd["parameters"]
    text = cli("layers", str(db)).stdout
    assert f"{n} evaluations of the optimizer's closure" in text.splitlines()[0]
    assert "per micro-batch" not in cli("report", str(db)).stdout


def test_lbfgs_history_growing_all_run_is_not_a_leak(runs: Any) -> None:
    """At default options, a history still filling up at the end of the run (3 iterations a
    step, 100 pairs kept): it grows steadily, but it is the optimizer's own state."""
    db = runs("mlp_lbfgs3", str(SCENARIOS / "mlp.py"), "--optimizer", "lbfgs", "--lbfgs-iter", "3",
              "--steps", "12", options=())
    report = report_json(db)
    assert report["leaks"] == [] and report["leak_check"]["verdict"] == "ok"
    out = cli("leaks", str(db), "--json")
    grew = [g for g in json.loads(out.stdout)["diff"] if g["bytes_delta"] > 0]
    assert grew and all(g["category"] == "optimizer_state" for g in grew), grew


GPT128 = ("--steps", "3", "--eval-every", "0", "--seq", "128")  # batch 8, 4 heads, 2 layers: its defaults


def test_attention_materialising_scores(runs: Any) -> None:
    """tiny_gpt's NaiveAttention at 128 tokens (the run the checkpointing test reads too)."""
    b, heads, n, layers = 8, 4, 128, 2
    db = runs("gpt128", str(EXAMPLES / "tiny_gpt.py"), *GPT128)
    got = by_technique(suggestions(db))
    assert "efficient_attention" in got
    assert "blocks.0.attn" in got["efficient_attention"].evidence
    assert "scaled_dot_product_attention" in got["efficient_attention"].how
    # what NaiveAttention keeps that SDPA does not: the fp32 softmax output b*h*n*n and the
    # n*n bool mask, per layer
    scores = layers * (4 * b * heads * n * n + n * n)
    assert abs(got["efficient_attention"].estimated_saving_bytes - scores) <= 0.05 * scores
    assert "lighter_optimizer" not in got  # AdamW state is small next to these activations


def test_torch_transformer_layers_are_told_about_attention_dropout(runs: Any) -> None:
    """nn.TransformerEncoderLayer already asks nn.MultiheadAttention for no weights; on CPU its
    attention dropout is what stores the scores (the flash kernel takes none): the advice says
    so instead of need_weights=False, and without the dropout nothing is suggested."""
    script = str(SCRIPTS / "torch_transformer.py")
    got = by_technique(suggestions(runs("tt_dropout", script, "0.2", options=())))
    how = got["efficient_attention"].how
    assert how.startswith("torch's TransformerEncoderLayer already calls nn.MultiheadAttention")
    assert "dropout=0.0" in how
    assert "efficient_attention" not in by_technique(suggestions(runs("tt_nodropout", script, "0.0", options=())))


def test_attention_through_sdpa_is_left_alone(runs: Any) -> None:
    """The SDPA run the efficient_attention estimate is measured against."""
    db = runs("gpt_sdpa", str(SCENARIOS / "gpt.py"), "--sdpa", "--steps", "3", "--seq", "128")
    got = by_technique(suggestions(db))
    assert "efficient_attention" not in got
    assert "activation_checkpointing" in got


def test_efficient_attention_estimate_matches_the_measured_change(runs: Any) -> None:
    """Same model, naive attention then SDPA: the estimate from the first run against the
    activations the second one measured."""
    naive = runs("gpt_naive", str(SCENARIOS / "gpt.py"), "--steps", "3", "--seq", "128")
    sdpa = runs("gpt_sdpa", str(SCENARIOS / "gpt.py"), "--sdpa", "--steps", "3", "--seq", "128")
    est = by_technique(suggestions(naive))["efficient_attention"].estimated_saving_bytes
    measured = breakdown(naive)["activations"] - breakdown(sdpa)["activations"]
    assert measured > 0
    assert abs(est - measured) <= 0.10 * measured, (est, measured)


def test_checkpointing_plan_against_a_checkpointed_run(runs: Any) -> None:
    """tiny_gpt with and without --checkpoint: what the plan says checkpointing keeps through
    the forward (block inputs + activations outside the blocks) is what the checkpointed run
    measured. memscope's per-step activations leave out the recomputation in backward, so the
    estimate (which adds one recomputed block) saves less than that measurement shows."""
    plain = runs("gpt128", str(EXAMPLES / "tiny_gpt.py"), *GPT128)
    ckpt = runs("gpt128_ckpt", str(EXAMPLES / "tiny_gpt.py"), *GPT128, "--checkpoint")
    with RunReader(plain) as r:
        facts = gather(r, summarize(r))
    assert facts is not None
    plan = checkpoint_plan(facts)
    assert plan is not None and plan.container == "blocks" and plan.mode == "blocks"
    assert plan.segments == 2 and plan.plain == 0  # every block checkpointed, as the trial does
    assert [b["name"] for b in plan.blocks] == ["blocks.0", "blocks.1"]
    assert plan.kept == 2 * 8 * 128 * 64 * 4  # each block's fp32 input (batch x seq x d_model)
    measured = breakdown(ckpt)["activations"]
    assert abs((plan.kept + plan.outside) - measured) <= 0.05 * measured, (plan, measured)
    est = by_technique(suggestions(plain))["activation_checkpointing"].estimated_saving_bytes
    assert est == plan.peak_now - plan.after.bytes  # the peak now less the peak once checkpointed
    assert est < breakdown(plain)["activations"] - measured


def test_adam_dominated_by_optimizer_state(runs: Any) -> None:
    db = runs("wide_adam", str(SCENARIOS / "wide_adam.py"))
    got = by_technique(suggestions(db))
    assert "lighter_optimizer" in got
    bd = breakdown(db)
    # Adam: two states per parameter; SGD with momentum keeps one. The run's live-tensor peak is
    # in Adam's step, whose temporaries (a parameter's size twice, on CPU: the square root of the
    # second moment and the denominator) SGD's in-place step does not make: they go too
    with RunReader(db) as r:
        f = gather(r, summarize(r))
    assert f is not None and f.peak_phase == "optimizer" and f.tensor_peak is not None
    temps = f.tensor_peak - (f.parameters + f.gradients + f.optimizer_state + f.activations)
    # two 1024 x 1024 fp32 matrices (the activations, freed by then, are taken off: a lower bound)
    assert abs(temps + f.activations - 2 * 1024 * 1024 * 4) < 64 << 10, (temps, f.activations)
    assert abs(got["lighter_optimizer"].estimated_saving_bytes
               - (bd["optimizer_state"] - bd["parameters"] + temps)) < 1024
    assert "temporaries beside the states" in got["lighter_optimizer"].evidence
    assert not set(got) & {"activation_checkpointing", "gradient_accumulation", "mixed_precision",
                           "efficient_attention", "optimizer_offload", "quantization", "sharding"}


def test_frozen_base_suggests_quantization(runs: Any) -> None:
    db = runs("frozen", str(SCENARIOS / "wide_adam.py"), "--freeze")
    got = by_technique(suggestions(db))
    assert "quantization" in got
    frozen = 3 * 1024 * 1024  # the three frozen 1024 x 1024 weight matrices (biases are 1-D)
    assert got["quantization"].estimated_saving_bytes == 4 * frozen - int(frozen * 4.5 / 8)
    assert "lighter_optimizer" not in got  # only the small head is trained


def test_leak_is_ranked_with_the_rest(runs: Any) -> None:
    db = runs("leaky", str(EXAMPLES / "leaky.py"), "--steps", "20",
              options=("--inventory-every", "1"))
    items = suggestions(db)
    leak = by_technique(items)["fix_leak"]
    assert "loss.item()" in leak.how and "loss_history" in leak.evidence
    doc = report_json(db)
    assert doc["suggestions"][0]["technique"] == items[0].technique


def test_data_parallel_run_suggests_sharding(tmp_path: Path) -> None:
    db = attach(tmp_path / "ddp.db", "--", *torchrun(2), str(SCENARIOS / "ddp_adam.py"))
    got = by_technique(suggestions(db))
    bd = breakdown(db)
    states = bd["parameters"] + bd["gradients"] + bd["optimizer_state"]
    assert got["sharding"].estimated_saving_bytes == states - states // 2
    assert "optimizer_offload" not in got  # CPU: nothing to offload to


def test_report_json_text_and_oom_carry_suggestions(runs: Any, tmp_path: Path) -> None:
    db = runs("mlp", str(SCENARIOS / "mlp.py"))
    doc = report_json(db)
    items = doc["suggestions"]
    assert items and all(set(x) == {"technique", "estimated_saving_bytes", "evidence", "how", "peak"}
                         for x in items)
    # the peak a figure is modelled from (checkpointing: before, after, where, its parts), else null
    (ckpt,) = [x for x in items if x["technique"] == "activation_checkpointing"]
    peak = ckpt["peak"]
    assert peak["before_bytes"] - peak["after_bytes"] == ckpt["estimated_saving_bytes"]
    assert sum(p["bytes"] for p in peak["parts"]) == peak["after_bytes"] and peak["timeline"] == "modelled"
    assert all(x["peak"] is None for x in items if x["technique"] in ("mixed_precision", "gradient_accumulation"))
    assert [x["estimated_saving_bytes"] for x in items] == sorted(
        (x["estimated_saving_bytes"] for x in items), reverse=True)
    assert all(isinstance(x["estimated_saving_bytes"], int) and x["technique"] in ALL for x in items)
    text = cli("report", str(db))
    assert text.returncode == 0
    assert "suggestions ranked by estimated saving" in text.stdout
    assert items[0]["technique"] in text.stdout

    oom = tmp_path / "oom.db"
    out = memscope("attach", "--headless", "--db", str(oom), "--layers-every", "1",
                   str(SCENARIOS / "mlp.py"), "--oom-at-step", "3", timeout=240)
    assert out.returncode == 1 and "can't allocate memory" in out.stderr
    shown = cli("oom", str(oom))
    assert shown.returncode == 0, shown.stderr
    tips = json.loads(cli("oom", str(oom), "--json").stdout)["suggestions"]
    assert 0 < len(tips) <= 3 and tips[0]["technique"] in shown.stdout
    assert "gradient_accumulation" in {t["technique"] for t in tips}


def test_shape_bug_oom_gets_no_technique(oom_example_run: Path) -> None:
    doc = json.loads(cli("oom", str(oom_example_run), "--json").stdout)  # examples/oom.py, failed
    assert doc["suggestions"] == []  # no memory technique fixes a wrong shape


# -- the fragmentation rule: allocator rows as the agent writes them (CUDA only) ------------------

GiB = 1 << 30


def cuda_run(path: Path, samples: list[dict[str, int]]) -> Path:
    """A run file of one CUDA process: a profiled step and the given cuda_samples rows (keys as
    the agent maps torch.cuda.memory_stats(): reserved_bytes.all.current -> reserved, ...)."""
    conn = sqlite3.connect(path)
    migrate(conn, str(path))
    now = time.time()
    conn.execute("INSERT INTO run (id, command, started, ended, exit_code, status) "
                 "VALUES (1, '[\"python\", \"train.py\"]', ?, ?, 0, 'finished')", (now - 10, now))
    conn.execute("INSERT INTO processes (id, pid, rank, world_size, device, started, status) "
                 "VALUES (1, 4242, NULL, 1, 'cuda:0', ?, 'stopped')", (now - 10,))
    conn.execute("INSERT INTO steps (proc, step, start, end, peak_allocated, peak_reserved) "
                 "VALUES (1, 0, ?, ?, ?, ?)", (now - 9, now - 1, max(s["allocated_peak"] for s in samples),
                                               max(s["reserved"] for s in samples)))
    conn.execute("INSERT INTO step_breakdown VALUES (1, 0, ?, ?, ?, ?)",
                 (4 * GiB, 4 * GiB, 8 * GiB, 10 * GiB))
    for i, s in enumerate(samples):
        conn.execute(
            "INSERT INTO cuda_samples (proc, t, device, allocated, allocated_peak, reserved, "
            "reserved_peak, active, active_peak, inactive_split, alloc_retries, ooms) "
            "VALUES (1, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
            (now - 8 + i, s["allocated"], s["allocated_peak"], s["reserved"], s["reserved"],
             s["allocated"], s["allocated_peak"], s["inactive_split"], s["alloc_retries"]))
    conn.commit()
    conn.close()
    return path


def test_fragmented_allocator_suggests_expandable_segments(tmp_path: Path) -> None:
    rows = [dict(allocated=20 * GiB, allocated_peak=20 * GiB, reserved=24 * GiB,
                 inactive_split=1 * GiB, alloc_retries=0),
            dict(allocated=26 * GiB, allocated_peak=30 * GiB, reserved=38 * GiB,
                 inactive_split=9 * GiB, alloc_retries=3),
            dict(allocated=22 * GiB, allocated_peak=30 * GiB, reserved=38 * GiB,
                 inactive_split=7 * GiB, alloc_retries=3)]
    got = by_technique(suggestions(cuda_run(tmp_path / "frag.db", rows)))
    frag = got["allocator_config"]
    assert frag.estimated_saving_bytes == 9 * GiB  # the inactive split bytes at the highest reserved
    assert "expandable_segments:True" in frag.how and "3 allocation retries" in frag.evidence
    # on a GPU the optimizer state (8 of 26 GiB of tensors) can be offloaded
    assert got["optimizer_offload"].estimated_saving_bytes == 8 * GiB


def test_fragmentation_read_before_the_script_freed_its_blocks(tmp_path: Path) -> None:
    """The cache keeps its reserved bytes after the fragmented blocks are freed (their splits
    merge): the sample at the highest reserved can read after that. Seen on an H100 running
    fragment.py: no advice. A sample far under the peak (a warm-up) does not count."""
    rows = [dict(allocated=2 * GiB, allocated_peak=2 * GiB, reserved=20 * GiB,
                 inactive_split=15 * GiB, alloc_retries=0),  # far under the peak: not read
            dict(allocated=26 * GiB, allocated_peak=30 * GiB, reserved=37 * GiB,
                 inactive_split=6 * GiB, alloc_retries=1),  # the fragmented cache near the peak
            dict(allocated=30 * GiB, allocated_peak=30 * GiB, reserved=38 * GiB,
                 inactive_split=0, alloc_retries=1),  # blocks freed: the split is gone
            dict(allocated=2 * GiB, allocated_peak=30 * GiB, reserved=38 * GiB,
                 inactive_split=0, alloc_retries=1)]
    frag = by_technique(suggestions(cuda_run(tmp_path / "freed.db", rows)))["allocator_config"]
    assert frag.estimated_saving_bytes == 6 * GiB
    assert "near the highest reserved memory (37.00 GiB reserved, 26.00 GiB allocated)" in frag.evidence


def test_compact_allocator_gets_no_allocator_advice(tmp_path: Path) -> None:
    rows = [dict(allocated=26 * GiB, allocated_peak=30 * GiB, reserved=31 * GiB,
                 inactive_split=512 << 20, alloc_retries=0)]
    got = by_technique(suggestions(cuda_run(tmp_path / "ok.db", rows)))
    assert "allocator_config" not in got


@pytest.mark.cuda
def test_fragmenting_script_on_a_gpu(tmp_path: Path) -> None:
    db = attach(tmp_path / "frag.db", str(SCENARIOS / "fragment.py"), options=("--sample-hz", "200"))
    with sqlite3.connect(db) as conn:
        split = conn.execute("SELECT max(inactive_split) FROM cuda_samples").fetchone()[0]
    assert split and split > 0
    assert "allocator_config" in by_technique(suggestions(db))

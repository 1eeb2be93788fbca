"""``memscope whatif``: techniques applied to an unchanged script, measured against a baseline."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, SCRIPTS, memscope
from memscope.analysis.whatif import Measure, compare, estimate_for, measure
from memscope.cli.whatif import render
from memscope.store.reader import RunReader

TINY_GPT = [str(EXAMPLES / "tiny_gpt.py"), "--layers", "2", "--d-model", "32", "--seq", "32",
            "--batch", "4", "--eval-every", "0", "--steps", "30"]

MLP = '''
import torch, torch.nn as nn, torch.nn.functional as F
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(40):
    loss = F.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 4, (16,)))
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


@pytest.fixture(scope="module")
def tiny_gpt_whatif(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out_dir = tmp_path_factory.mktemp("whatif") / "runs"  # created by whatif, as export --csv does
    before = (EXAMPLES / "tiny_gpt.py").read_bytes()
    out = memscope("whatif", "--json", "--steps", "3", "--db-dir", str(out_dir), *TINY_GPT, timeout=600)
    assert out.returncode == 0, out.stderr
    assert (EXAMPLES / "tiny_gpt.py").read_bytes() == before  # the script is not edited
    return json.loads(out.stdout)


def _trial(doc: dict, technique: str) -> dict:
    return next(t for t in doc["trials"] if t["technique"] == technique)


def test_whatif_runs_a_baseline_and_one_trial_per_technique(tiny_gpt_whatif: dict) -> None:
    doc = tiny_gpt_whatif
    assert doc["schema"] == "memscope.whatif/1" and doc["steps"] == 3
    assert doc["baseline"]["steps"] == 3 and doc["baseline"]["status"] == "finished"
    assert [t["technique"] for t in doc["trials"]] == [
        "mixed_precision", "activation_checkpointing", "lighter_optimizer"]
    for t in doc["trials"]:
        assert t["applied"] is True, t
        assert t["steps"] == 3 and t["exit_code"] == 0
        assert t["measured_by"] == "tensor_peak"  # CPU: the exact live-tensor peak
        assert t["measured_saving_bytes"] == doc["baseline"]["tensor_peak_bytes"] - t["tensor_peak_bytes"]
        assert Path(t["db"]).exists()
        if t["estimated_saving_bytes"] is None:
            assert t["suggested"] is False and t["estimate_error"] is None
        else:
            err = (t["measured_saving_bytes"] - t["estimated_saving_bytes"]) / t["estimated_saving_bytes"]
            assert t["estimate_error"] == pytest.approx(err)


def test_lighter_optimizer_swaps_adamw_for_sgd_with_momentum(tiny_gpt_whatif: dict) -> None:
    base = tiny_gpt_whatif["baseline"]["breakdown"]
    t = _trial(tiny_gpt_whatif, "lighter_optimizer")
    # AdamW: exp_avg + exp_avg_sq (+ a step scalar each); SGD momentum: one buffer per parameter
    assert base["optimizer_state"] > 2 * base["parameters"]
    assert t["breakdown"]["optimizer_state"] == t["breakdown"]["parameters"] == base["parameters"]
    assert t["breakdown"]["activations"] == base["activations"]
    assert t["measured_saving_bytes"] >= base["parameters"] * 0.9
    assert "AdamW" in t["how"][0]["replaced"]


def test_checkpointing_and_autocast_cut_activations(tiny_gpt_whatif: dict) -> None:
    base = tiny_gpt_whatif["baseline"]
    ckpt = _trial(tiny_gpt_whatif, "activation_checkpointing")
    amp = _trial(tiny_gpt_whatif, "mixed_precision")
    assert ckpt["how"][0]["container"] == "blocks" and ckpt["how"][0]["blocks"] == 2
    assert ckpt["breakdown"]["activations"] < base["breakdown"]["activations"] / 2
    assert ckpt["measured_saving_bytes"] > 0
    # the recomputation in backward costs memory the saved-tensor breakdown does not see
    assert ckpt["breakdown_saving_bytes"] > ckpt["measured_saving_bytes"]
    assert amp["how"][0]["device"] == "cpu"
    assert amp["breakdown"]["activations"] < base["breakdown"]["activations"]
    assert amp["breakdown"]["parameters"] == base["breakdown"]["parameters"]  # weights stay fp32
    assert amp["measured_saving_bytes"] > 0


def test_whatif_text_output_and_attach_try(tmp_path: Path) -> None:
    script = tmp_path / "mlp.py"
    script.write_text(MLP)
    out = memscope("whatif", "--try", "lighter_optimizer", "--steps", "2", "--db-dir", str(tmp_path),
                   str(script), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"what-if: {script}, 2 steps per run; measured saving = peak of live")
    row = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith("lighter_optimizer "))
    assert " yes " in row
    assert (tmp_path / "whatif-mlp-baseline.db").exists() and (tmp_path / "whatif-mlp-lighter_optimizer.db").exists()
    # the same agent code from attach: the technique applied to an ordinary recorded run
    db = tmp_path / "tried.db"
    out = memscope("attach", "--db", str(db), "--headless", "--try", "lighter_optimizer", str(script))
    assert out.returncode == 0, out.stderr
    import sqlite3

    conn = sqlite3.connect(db)
    events = conn.execute("SELECT message FROM events WHERE kind = 'technique'").fetchall()
    conn.close()
    assert events == [("lighter_optimizer: Adam(...) built as SGD(momentum=0.9)",)]


def test_tensor_peak_counts_a_temporary_exactly(tmp_path: Path) -> None:
    """One run, a temporary made in steps 3 to 5 (one process instead of a run with it and a
    run without): the peaks of steps 4 and 5, which hold it from their start (the previous
    step's) to their end (their own), are those of steps 1 and 2 plus its 4 MiB, to the byte."""
    code = '''
import sys, torch, memscope
memscope.start(sys.argv[1], tensor_peak=True, layers_every=0, inventory_every=0, max_steps=7)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
while True:
    extra = torch.ones(1 << 20) if 3 <= step <= 5 else None  # 4 MiB alive through the step
    model(torch.randn(32, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
    del extra
    step += 1
'''
    rows = tensor_peak_events(code, tmp_path / "run.db", "")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    peak = {r["step"]: r["peak_bytes"] for r in rows}
    assert peak[1] == peak[2] and peak[4] == peak[5], peak
    assert peak[4] - peak[1] == 4 << 20


def tensor_peak_events(code: str, db: Path, arg: str) -> list[dict[str, Any]]:
    """Run ``code`` (a script taking the run file and ``arg``) and return its tensor_peak events."""
    import sqlite3

    out = subprocess.run([sys.executable, "-c", code, str(db), arg], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    conn = sqlite3.connect(db)
    rows = [json.loads(d) for (d,) in conn.execute("SELECT data FROM events WHERE kind = 'tensor_peak'")]
    conn.close()
    return rows


def test_tensor_peak_says_whether_the_steps_gradients_were_live_at_it(tmp_path: Path) -> None:
    """Gradients zeroed in place stay live through the peak (all of them counted); set to None
    ahead of the forward, none of the step's starting .grad is live at it. One run, the two
    ways in turn (every step starts with the .grad its previous backward made)."""
    code = '''
import sys, torch, memscope
memscope.start(sys.argv[1], tensor_peak=True, layers_every=0, inventory_every=0, max_steps=5)
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
while True:
    keep = step % 2 == 0  # steps 0, 2, 4 keep their gradients; 1, 3 free them
    if not keep:
        opt.zero_grad(set_to_none=True)
    loss = model(torch.randn(512, 256)).relu().sum()
    if keep:
        opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    step += 1
'''
    rows = tensor_peak_events(code, tmp_path / "run.db", "")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    got: dict[str, set[int]] = {"keep": set(), "free": set()}
    for r in rows:
        got["free" if r["step"] % 2 else "keep"].add(r["start_grad_bytes_at_peak"])
    assert got == {"keep": {(256 * 256 + 256) * 4}, "free": {0}}


@pytest.mark.parametrize("args, needle", [
    (["--try", "bogus"], "unknown technique 'bogus'"),
    (["--steps", "1"], "--steps must be at least 2"),
    (["--db-dir", "/dev/null/runs"], "--db-dir /dev/null/runs: Not a directory"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    script = tmp_path / "mlp.py"
    script.write_text(MLP)
    out = memscope("whatif", *args, str(script))
    assert out.returncode == 2 and needle in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_missing_script_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = memscope("whatif", str(tmp_path / "nope.py"))
    assert out.returncode == 2 and "no such script" in out.stderr and out.stderr.count("\n") == 1


def _measure(tensor_peak: int | None, total: int, rss: int, metric: str = "rss") -> Measure:
    bd = {"parameters": 100, "gradients": 100, "optimizer_state": 200, "activations": total - 400,
          "total": total}
    return Measure("x.db", "finished", 0, 3, rss, metric, bd, 1, [], True, tensor_peak)


def test_compare_picks_the_measure_by_device_and_checks_the_estimate() -> None:
    base, trial = _measure(1000, 900, 10**9), _measure(700, 600, 10**9 - 50)
    c = compare("mixed_precision", base, trial, estimate_for(
        [{"technique": "mixed_precision", "estimated_saving_bytes": 250}], "mixed_precision"))
    assert (c.measured_by, c.measured_saving_bytes, c.breakdown_saving_bytes, c.peak_saving_bytes) == \
        ("tensor_peak", 300, 300, 50)
    assert c.estimate_error == pytest.approx(0.2) and c.within_tolerance is True
    assert c.applied is False  # no technique event in the trial
    # no tensor peak: the breakdown; on CUDA: the allocator peak, whatever else there is
    c = compare("x", _measure(None, 900, 10), _measure(None, 800, 5), estimate_for([], "x"))
    assert (c.measured_by, c.measured_saving_bytes, c.estimated_saving_bytes, c.within_tolerance) == \
        ("breakdown", 100, None, None)
    c = compare("x", _measure(1000, 900, 5000, "cuda_allocated"), _measure(10, 800, 3000, "cuda_allocated"), 4000)
    assert (c.measured_by, c.measured_saving_bytes, c.within_tolerance) == ("cuda_allocated", 2000, False)


def test_a_failed_trial_measures_nothing() -> None:
    """A trial that failed (exit 1 in step 0: dcgan's BCELoss given a bfloat16 output) has no
    tensor peak and no breakdown; its RSS against the baseline's is no saving (it read 16.34 MiB)."""
    failed = Measure("t.db", "failed", 1, 0, 10**9 - 17_000_000, "rss", None, None, [], False, None)
    c = compare("mixed_precision", _measure(1000, 900, 10**9), failed, 3_000_000)
    assert (c.measured_saving_bytes, c.peak_saving_bytes, c.breakdown_saving_bytes, c.tensor_peak_saving_bytes,
            c.estimate_error, c.within_tolerance) == (None, None, None, None, None, None)
    done = Measure("t.db", "finished", 0, 3, 10**9 - 50, "rss", None, None, [], False, 700)
    assert compare("mixed_precision", _measure(1000, 900, 10**9), done, 250).measured_saving_bytes == 300


def test_attach_try_rejects_an_unknown_technique(tmp_path: Path) -> None:
    script = tmp_path / "mlp.py"
    script.write_text(MLP)
    out = memscope("attach", "--db", str(tmp_path / "x.db"), "--try", "quantization", str(script))
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "unknown technique in ['quantization']" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "x.db").exists()


def test_checkpoint_plan_option_is_validated() -> None:
    from memscope.agent.runtime.config import AgentOptions

    plan = {"container": "body", "segments": 2}
    assert AgentOptions.from_mapping({"checkpoint_plan": plan}).checkpoint_plan == plan
    for bad in ({"container": "body"}, {"container": 3, "segments": 2},
                {"container": "body", "segments": 1}, {"container": "body", "segments": True},
                "body:2"):
        with pytest.raises(ValueError, match="checkpoint_plan"):
            AgentOptions.from_mapping({"checkpoint_plan": bad})


def test_autocast_trial_on_a_float64_model_says_why_it_is_not_applied(tmp_path: Path) -> None:
    """autocast casts only float32 tensors: on a float64 model the trial is not applied, and
    the table says why instead of a measured 0 that reads as "mixed precision saves nothing".
    One whatif (the JSON); the text table is the CLI's render of the same two run files."""
    script = str(EXAMPLES / "scenarios" / "mlp.py")
    out = memscope("whatif", "--json", "--try", "mixed_precision", "--steps", "3", "--db-dir", str(tmp_path),
                   script, "--dtype", "fp64", timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    (c,) = doc["trials"]
    assert c["applied"] is False and "float64" in c["how"][0]["why"]
    with RunReader(doc["baseline"]["db"]) as base_reader, RunReader(c["db"]) as trial_reader:
        base, trial = measure(base_reader), measure(trial_reader)
    comp = compare("mixed_precision", base, trial, c["estimated_saving_bytes"])
    text = render(script, 3, base.peak_metric, [comp], None, str(tmp_path))
    assert "mixed_precision: not applied: the model's parameters are float64" in text


def test_autocast_trial_of_a_gan_casts_both_models_and_feeds_bce_float32(tmp_path: Path) -> None:
    """pytorch/examples' dcgan's shape (tests/scripts/advice_cases.py gan_bce): the generator runs
    first, then a discriminator ending in a Sigmoid whose output goes to nn.BCELoss. The trial
    autocasts both models (it did the generator alone) and computes the loss in float32 from the
    bfloat16 output, as the advice says (autocast refuses binary_cross_entropy, and a bfloat16
    input does not match its float32 target: the trial stopped at the first loss)."""
    script = str(SCRIPTS / "advice_cases.py")
    out = memscope("whatif", "--json", "--try", "mixed_precision", "--steps", "3", "--db-dir", str(tmp_path),
                   script, "gan_bce", timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    (c,) = doc["trials"]
    assert c["status"] == "finished" and c["steps"] == 3, c
    models = [h for h in c["how"] if h.get("device") == "cpu"]
    assert len(models) == 2 and all(h["applied"] for h in models), c["how"]
    assert [h for h in c["how"] if h.get("bce_float")], c["how"]
    assert c["tensor_peak_saving_bytes"] > 0

"""``memscope fit SCRIPT.py --gpu SIZE``: the largest micro-batch, checked by real runs under a
tensor-byte cap, and the plans that make the current batch fit; the planning functions; the
``fit_plan`` suggestion of ``report`` for a recorded run near its device's limit."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLES, ROOT, cli, memscope
from memscope.analysis import fit as planning
from memscope.analysis.fit import Allowance, BatchArgument, Plan
from memscope.errors import UserError
from memscope.runners.fit import FitResult, fit, render

TINY = [str(EXAMPLES / "tiny_gpt.py"), "--eval-every", "0"]
CAP = ROOT / "tests" / "scripts" / "tensor_cap.py"
KEYS = {"schema", "budget_bytes", "max_micro_batch", "batch_argument", "plans",
        "gpu_bytes", "tensor_budget_bytes", "cuda_context_bytes", "fragmentation_bytes"}
TECHNIQUES = {"mixed_precision", "activation_checkpointing", "gradient_accumulation",
              "lighter_optimizer", "sharding", "selective_checkpointing"}


def fit_json(*args: str, timeout: float = 300) -> tuple[dict[str, Any], str]:
    """The document and what fit said on stderr."""
    out = memscope("fit", "--json", *args, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


def capped(cap: int, *cmd: str) -> subprocess.CompletedProcess[str]:
    """The script run for real on CPU, an out-of-memory error above ``cap`` bytes of tensors."""
    return subprocess.run([sys.executable, str(CAP), str(cap), *cmd], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_the_largest_micro_batch_fits_for_real_and_one_more_does_not() -> None:
    """Issue #17's check: at the default allowances, the batch ``fit`` returns runs for real
    under a cap of the usable bytes (what the GPU holds after the CUDA context and the
    fragmentation reserve), and batch + 1 runs out of memory there."""
    budget = 560 << 20
    doc, stderr = fit_json("--gpu", "560MiB", *TINY)
    assert set(doc) == KEYS and doc["schema"] == "memscope.fit/1"
    assert doc["budget_bytes"] == budget and doc["batch_argument"] == "--batch"
    # the GPU and the budget the text's "budget" line explains, each under its own name
    assert doc["gpu_bytes"] == budget and doc["tensor_budget_bytes"] == Allowance().usable(budget) == 20 << 20
    assert stderr == f"memscope fit: fake runs of {TINY[0]} ...\n"  # piped, --json: no progress line
    batch = doc["max_micro_batch"]
    assert isinstance(batch, int) and batch > 8  # the script's own batch (8) fits with room
    # the script as it is fits: the only plan is no technique
    assert doc["plans"] == [{"techniques": [], "peak_bytes": doc["plans"][0]["peak_bytes"],
                             "fits": True, "cost": "none"}]
    cap = Allowance().usable(budget)
    ok = capped(cap, *TINY, "--steps", "4", "--batch", str(batch))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    over = capped(cap, *TINY, "--steps", "4", "--batch", str(batch + 1))
    assert over.returncode == 3 and "OOM: tensor cap" in over.stdout, over.stdout + over.stderr


PROGRESS: list[str] = []  # what plans_result's fit told its progress callback


@pytest.fixture(scope="module")
def plans_result(tmp_path_factory: pytest.TempPathFactory) -> FitResult:
    """tiny_gpt at batch 32 on a GPU with 3.85 MiB for tensors (its peak: 30.7 MiB), 2 ranks."""
    return fit(TINY[0], [*TINY[1:], "--batch", "32"], 543 << 20, world_size=2,
               workdir=str(tmp_path_factory.mktemp("fit")), progress=PROGRESS.append)


def test_progress_is_told_each_fake_run(plans_result: FitResult) -> None:
    """The progress line's callback (memscope.cli.progress) hears of every fake run, numbered as
    the text counts them, with its batch and techniques."""
    assert len(PROGRESS) == plans_result.trials
    assert [int(t.split()[2]) for t in PROGRESS] == list(range(1, plans_result.trials + 1))
    assert PROGRESS[0].startswith("fake run 1 (as is")
    assert any("--batch 32, " in t and "mixed_precision" in t for t in PROGRESS), PROGRESS


@pytest.fixture(scope="module")
def plans_doc(plans_result: FitResult) -> dict[str, Any]:
    doc = plans_result.as_json()
    assert set(doc) == KEYS
    return json.loads(json.dumps(doc))


def test_plans_make_the_current_batch_fit(plans_doc: dict[str, Any]) -> None:
    doc = plans_doc
    usable = Allowance().usable(doc["budget_bytes"])
    plans = doc["plans"]
    as_is = next(p for p in plans if not p["techniques"])
    assert not as_is["fits"] and as_is["peak_bytes"] > usable
    for p in plans:
        assert set(p) == {"techniques", "peak_bytes", "fits", "cost"}
        assert p["fits"] == (p["peak_bytes"] <= usable)
        assert {t["technique"] for t in p["techniques"]} <= TECHNIQUES
    by = {tuple(t["technique"] for t in p["techniques"]): p for p in plans}
    # each technique alone, measured by its own fake run, saves memory
    for alone in (("mixed_precision",), ("activation_checkpointing",)):
        assert by[alone]["peak_bytes"] < as_is["peak_bytes"]
    ckpt = by[("activation_checkpointing",)]["techniques"][0]
    assert ckpt["blocks"] == ["blocks.0", "blocks.1"] and ckpt["of"] == 2
    assert "FLOPs (recompute)" in by[("activation_checkpointing",)]["cost"]
    fitting = [p for p in plans if p["fits"]]
    assert fitting, plans
    # the cheapest that fits keeps the effective batch of 32 through accumulation
    acc = next(t for t in fitting[0]["techniques"] if t["technique"] == "gradient_accumulation")
    assert acc["effective_batch"] == 32 and acc["steps"] * acc["micro_batch"] == 32
    # sharding over the 2 ranks: ZeRO plans with their communication
    zero = [p for p in plans if any(t["technique"] == "sharding" for t in p["techniques"])]
    assert zero and all(t["world_size"] == 2 for p in zero for t in p["techniques"]
                        if t["technique"] == "sharding")
    assert any("DDP communication" in p["cost"] for p in zero)


def test_an_accumulation_plan_fits_for_real(plans_doc: dict[str, Any]) -> None:
    """The micro-batch of the accumulation-only plan (runnable by the cap script alone: the
    script's own --batch), run for real under the cap, fits. Its absence is a failure, not a skip."""
    only = [p for p in plans_doc["plans"]
            if p["fits"] and [t["technique"] for t in p["techniques"]] == ["gradient_accumulation"]]
    assert only, [p["techniques"] for p in plans_doc["plans"]]
    plan = only[0]
    micro = plan["techniques"][0]["micro_batch"]
    cap = Allowance().usable(plans_doc["budget_bytes"])
    out = capped(cap, *TINY, "--steps", "4", "--batch", str(micro))
    assert out.returncode == 0, out.stdout + out.stderr


def test_text_output_names_the_budget_and_marks_the_plan(plans_result: FitResult) -> None:
    text = render(plans_result)
    assert "on a 543.00 MiB GPU x 2 ranks" in text
    assert "3.85 MiB for tensors = 543.00 MiB - 512.00 MiB CUDA context - 5%" in text
    assert "as is       batch 32 (--batch): allocator peak 30.70 MiB, does NOT fit" in text
    assert "largest that fits as it is: --batch 2 (peak 3.70 MiB; 3 needs 4.49 MiB)" in text
    marked = [ln for ln in text.splitlines() if ln.lstrip().startswith("->")]
    assert len(marked) == 1 and " yes " in marked[0]


def test_a_dataloader_batch_is_found_and_varied(tmp_path: Path) -> None:
    script = tmp_path / "loader.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "data = TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1))\n"
        "for x, y in DataLoader(data, batch_size=16, shuffle=True):\n"
        "    ((m(x) - y) ** 2).mean().backward(); opt.step(); opt.zero_grad()\n")
    res = fit(str(script), [], (512 << 20) + (8 << 20), allowance=Allowance(512 << 20, 0.0),
              workdir=str(tmp_path))
    assert res.batch is not None and res.batch.name == "DataLoader(batch_size=...)"
    b = res.max_micro_batch
    assert b and b > 16
    assert res.batch_points[b] <= 8 << 20 < res.batch_points[b + 1]


@pytest.mark.parametrize("args, message", [
    (["examples/tiny_gpt.py"], "--gpu SIZE is required"),
    (["--gpu", "lots", "examples/tiny_gpt.py"], "not a size"),
    (["--gpu", "24GiB", "--world-size", "0", "examples/tiny_gpt.py"], "--world-size must be at least 1"),
    (["--gpu", "24GiB", "nope.py"], "no such script: nope.py"),
    (["--gpu", "500MiB", "examples/tiny_gpt.py"], "leaves nothing for tensors"),
    (["--gpu", "24GiB"], "give a script"),
])
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    out = memscope("fit", *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_a_batch_argument_the_script_lacks(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--batch-arg --bs: the script has no such option"):
        fit(TINY[0], TINY[1:], 24 << 30, batch_arg="--bs", workdir=str(tmp_path))


# -- planning, pure -----------------------------------------------------------------------------------

def search(peak: Any, start: int, usable: int) -> tuple[int, int]:
    points = {start: peak(start)}
    while (b := planning.next_batch(points, usable)) is not None:
        assert b not in points
        points[b] = peak(b)
    return planning.largest_fitting(points, usable), len(points)


@pytest.mark.parametrize("peak, start, usable, runs", [
    (lambda b: 1000 + 37 * b, 8, 5000, 4),  # linear: found in 4 runs
    (lambda b: 1000 + 37 * b, 200, 5000, 6),  # from above
    (lambda b: 1000 + 3 * b * b, 8, 50000, 10),  # curved (attention over a growing sequence)
    (lambda b: 1000 + 37 * b, 8, 900, 3),  # not even 1 fits
])
def test_the_batch_search_finds_the_boundary(peak: Any, start: int, usable: int, runs: int) -> None:
    found, n = search(peak, start, usable)
    truth = max([b for b in range(1, 100_000) if peak(b) <= usable], default=0)
    assert found == truth and n <= runs


def test_batch_argument_from_argparse_and_its_value_in_the_arguments() -> None:
    parsers = [{"options": [{"options": ["--steps"], "dest": "steps", "value": 30, "default": 30},
                            {"options": ["-b", "--batch-size"], "dest": "batch_size", "value": 16,
                             "default": 8}]}]
    arg = planning.find_batch_argument(parsers, [])
    assert arg == BatchArgument("option", "--batch-size", 16)
    assert arg.script_args(["--batch-size", "16", "--lr", "3"], 40) == ["--batch-size", "40", "--lr", "3"]
    assert arg.script_args(["--batch-size=16"], 40) == ["--batch-size=40"]
    assert arg.script_args(["--lr", "3"], 40) == ["--lr", "3", "--batch-size", "40"]
    assert planning.find_batch_argument(parsers, [], named="--steps") == BatchArgument("option", "--steps", 30)
    assert planning.find_batch_argument([], [64]) == BatchArgument("dataloader", "DataLoader(batch_size=...)", 64)
    assert planning.find_batch_argument([], []) is None


def test_ranking_is_cheapest_first_and_drops_dominated_plans() -> None:
    mp = [planning.mixed_precision()]
    opt = [planning.lighter_optimizer(["AdamW"])]
    plans = [Plan([], 100, False, "none", 0.0),
             Plan(opt, 90, False, "", planning.score(opt)),
             Plan(mp, 60, True, "", planning.score(mp)),
             Plan(mp + opt, 70, True, "", planning.score(mp + opt))]
    ranked = planning.rank(plans)
    assert [p.ids for p in ranked] == [(), ("mixed_precision",)]  # the rest cost more, save less


def test_sharding_divides_what_was_live_at_the_peak() -> None:
    at_peak = {"parameters": 400, "gradients": 400, "optimizer_state": 800, "activations": 1000, "other": 0}
    assert planning.shard(2600, at_peak, 1, 4, 0) == 2600 - 600
    assert planning.shard(2600, at_peak, 2, 4, 0) == 2600 - 600 - 300
    # stage 3 keeps a quarter of the parameters plus two gathered blocks of 50 (3/4 of them new)
    assert planning.shard(2600, at_peak, 3, 4, 50) == 2600 - 600 - 300 - 300 + 75
    assert planning.communication(2, 4, 1000) == 1500 and planning.communication(3, 4, 1000) == 2250


# -- report: a recorded run near its device's limit ---------------------------------------------------

GiB = 1 << 30


def near_limit_run(path: Path, reserved: int, total: int) -> Path:
    from test_suggestions import cuda_run

    cuda_run(path, [dict(allocated=26 * GiB, allocated_peak=29 * GiB, reserved=reserved,
                         inactive_split=512 << 20, alloc_retries=0)])
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO nvml_samples (proc, t, device, used, total) VALUES (1, ?, 0, ?, ?)",
                     (time.time(), reserved + GiB, total))
    return path


def test_report_suggests_a_plan_near_the_device_limit(tmp_path: Path) -> None:
    db = near_limit_run(tmp_path / "near.db", 30 * GiB, 32 * GiB)
    out = cli("report", "--json", str(db))
    assert out.returncode == 0, out.stderr
    sg = {s["technique"]: s for s in json.loads(out.stdout)["suggestions"]}
    plan = sg["fit_plan"]
    assert "94% of the 32.00 GiB device" in plan["evidence"]
    assert "memscope fit --gpu 32GiB SCRIPT.py" in plan["how"]
    assert plan["estimated_saving_bytes"] > 0
    far = near_limit_run(tmp_path / "far.db", 30 * GiB, 80 * GiB)
    out = cli("report", "--json", str(far))
    assert "fit_plan" not in {s["technique"] for s in json.loads(out.stdout)["suggestions"]}

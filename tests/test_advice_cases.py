"""Advice true to the code (issue 36, item 5), on real runs of tests/scripts/advice_cases.py at
default options: an evaluation in eval mode with autograd on that runs out of memory is told to
run under no_grad / inference_mode, with what that saves, and not to checkpoint or accumulate; a
GAN's two optimizers are not read as accumulation; Adam that runs out of memory while it builds
its state at step 0 is measured by the whole state it builds; a transform module the DataLoader
calls is not the "(model)"; a warning the script triggers prints once under attach; the OOM limit
line's arithmetic adds up. (Several out-of-memory errors in one run: tests/test_oom.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import SCRIPTS, cli, memscope, report_json
from memscope.analysis.oom_limits import limit_line

SCRIPT = SCRIPTS / "advice_cases.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    out = {}
    for case in ("eval", "adam0", "gan", "loader"):
        db = tmp_path_factory.mktemp(case) / "run.db"
        out[case] = (db, memscope("attach", "--headless", "--db", str(db), str(SCRIPT), case))
    return out


def test_an_evaluation_with_autograd_on_is_told_no_grad(runs: dict[str, tuple[Path, Any]]) -> None:
    db, proc = runs["eval"]
    assert proc.returncode == 1, proc.stderr[-500:]
    report = report_json(db)
    oom = report["oom"]
    assert (oom["step"], oom["phase"], oom["module"]) == (2, "forward", "4")
    saved = oom["breakdown"]["activations"]  # what the forward saved before the failing layer
    assert saved >= 4096 * 1024 * 4 * 2  # the two Linear layers' inputs and the ReLUs' outputs, at least
    techniques = {s["technique"]: s for s in report["suggestions"]}
    assert techniques["no_grad"]["estimated_saving_bytes"] == saved
    assert "torch.no_grad()" in techniques["no_grad"]["how"] and "inference_mode" in techniques["no_grad"]["how"]
    assert "activation_checkpointing" not in techniques and "gradient_accumulation" not in techniques
    text = cli("oom", str(db)).stdout
    assert "the model was in eval mode (model.eval()) with autograd on" in text
    change = text.split("\nchange")[1].split("\nmeasured")[0]
    assert change.lstrip().startswith("an evaluation with autograd on") and "checkpointing" not in change


def test_adam_out_of_memory_at_step_0_is_measured_by_its_whole_state(runs: dict[str, tuple[Path, Any]]) -> None:
    db, proc = runs["adam0"]
    assert proc.returncode == 1, proc.stderr[-500:]
    params = 2 * (1024 * 1024 + 1024) * 4 + (8192 * 1024 + 8192) * 4  # trainable bytes
    small = 2 * 2 * (1024 * 1024 + 1024) * 4  # the two small layers' exp_avg and exp_avg_sq
    report = report_json(db)
    assert (report["oom"]["step"], report["oom"]["phase"]) == (0, "optimizer")
    (s,) = [s for s in report["suggestions"] if s["technique"] == "lighter_optimizer"]
    assert s["estimated_saving_bytes"] == 2 * params - params  # Adam's two states -> SGD's one
    # what it had built (and the 0-dim step counters, 4 bytes each)
    assert 0 <= report["oom"]["breakdown"]["optimizer_state"] - small < 64
    text = cli("oom", str(db)).stdout
    assert "in Adam.step(): 16.02 MiB of optimizer state built for 40.04 MiB of trainable parameters" in text
    assert "Adam builds 80.08 MiB of state in all (it was still building it)" in text


def test_a_gan_s_two_optimizers_are_not_accumulation(runs: dict[str, tuple[Path, Any]]) -> None:
    db, proc = runs["gan"]
    assert proc.returncode == 0, proc.stderr[-500:]
    (s,) = [s for s in report_json(db)["suggestions"] if s["technique"] == "gradient_accumulation"]
    assert s["how"].startswith("the step runs 2 optimizers (Adam, Adam)") and "already accumulates" not in s["how"]


def test_a_transform_the_dataloader_calls_is_not_the_model(runs: dict[str, tuple[Path, Any]]) -> None:
    db, proc = runs["loader"]
    assert proc.returncode == 0, proc.stderr[-500:]
    doc = json.loads(cli("layers", str(db), "--json").stdout)
    names = {m["module"]: m["type"] for m in doc["modules"]}
    assert names[""] == "Net" and names["fc1"] == "Linear" and names["Normalize"] == "Normalize"


def test_a_warning_the_script_triggers_prints_once(runs: dict[str, tuple[Path, Any]]) -> None:
    """warnings' default action shows a warning once per location; memscope left a
    catch_warnings() block at the step whose live tensors it measures (step 2), which resets that
    registry, and the script's warning printed again."""
    _, proc = runs["loader"]
    assert proc.stderr.count("UserWarning: the learning rate schedule is deprecated") == 1, proc.stderr


def test_the_limit_line_adds_up() -> None:
    over = limit_line({"kind": "RLIMIT_AS", "bytes": 3 << 30, "used_bytes": 2900 << 20}, 576 << 20)
    assert over.endswith("(the process's virtual size 2.83 GiB + the request 576.00 MiB = 3.39 GiB, "
                         "over it by 404.00 MiB)"), over
    under = limit_line({"kind": "RLIMIT_AS", "bytes": int(2.86 * 2 ** 30), "used_bytes": int(1.92 * 2 ** 30)},
                       576 << 20)
    assert "+ the request 576.00 MiB = 2.48 GiB, 386.56 MiB under it by these figures: the virtual size " \
           "was read after the failure" in under, under

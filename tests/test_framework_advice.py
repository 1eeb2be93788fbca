"""Suggestions name the framework's own switch: real Hugging Face Trainer and Lightning runs at
default options (tiny models built in code, nothing downloaded), and a plain loop that must get
none of it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from conftest import SCRIPTS, memscope, report_json

SCENARIOS = Path(__file__).resolve().parents[1] / "examples" / "scenarios"


def attach(tmp_path: Path, script: Path, *args: str) -> dict[str, Any]:
    db = tmp_path / "run.db"
    out = memscope("attach", "--headless", "--db", str(db), str(script), *args, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return report_json(db)


def hows(report: dict[str, Any]) -> dict[str, str]:
    return {s["technique"]: s["how"] for s in report["suggestions"]}


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_huggingface_trainer_gets_training_arguments(tmp_path: Path) -> None:
    report = attach(tmp_path, SCRIPTS / "hf_accumulate.py", str(tmp_path / "out"))
    assert report["hotspots_micro_batches"] == 4 and report["hotspots_closure_forwards"] == 0
    got = hows(report)
    acc = got["gradient_accumulation"]
    assert acc.startswith("with the Hugging Face Trainer:") and "gradient_accumulation_steps=8" in acc
    assert "in plain PyTorch:" in acc  # the loop's own change is still there
    assert "TrainingArguments(bf16=True)" in got["mixed_precision"]
    assert "gradient_checkpointing=True" in got["activation_checkpointing"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="needs lightning")
def test_lightning_trainer_gets_trainer_arguments(tmp_path: Path) -> None:
    report = attach(tmp_path, SCRIPTS / "lightning_accumulate.py")
    # Lightning's closure holds one forward: accumulation, not an LBFGS-style re-evaluation
    assert report["hotspots_micro_batches"] == 2 and report["hotspots_closure_forwards"] == 0
    acc = hows(report)["gradient_accumulation"]
    assert acc.startswith("with Lightning: Trainer(accumulate_grad_batches=4)")
    assert "already accumulates 2 micro-batches" in acc


def test_plain_loop_gets_plain_pytorch(tmp_path: Path) -> None:
    report = attach(tmp_path, SCENARIOS / "mlp.py")
    got = hows(report)
    assert got and not [h for h in got.values() if "plain PyTorch" in h or "Trainer" in h]

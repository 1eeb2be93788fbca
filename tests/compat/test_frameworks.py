"""Lightning Trainer and Hugging Face Trainer (both tiny, built in code, nothing downloaded):
plain, under attach, and under attach at its most invasive settings. Module names must be the
model's own: under Lightning, the LightningModule's (``net.0``), though Lightning calls
``self.net`` from ``training_step`` and never the LightningModule itself."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from harness import check, layer_rows, run_three

STEPS = 8


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install 'torch-memscope[integrations]')")


@pytest.mark.slow
def test_lightning_trainer(tmp_path: Path) -> None:
    needs("lightning")
    arms = run_three(tmp_path, "lightning_trainer.py")
    check(arms, tmp_path, STEPS)
    rows = layer_rows(arms["invasive"].db)
    assert {"net", "net.0", "net.1", "net.2"} <= set(rows), sorted(rows)
    assert not [m for m in rows if m[:1].isdigit() or m.startswith("Sequential")], sorted(rows)


@pytest.mark.slow
def test_huggingface_trainer(tmp_path: Path) -> None:
    needs("transformers")
    arms = run_three(tmp_path, "hf_trainer.py")
    check(arms, tmp_path, STEPS)
    rows = layer_rows(arms["invasive"].db)
    assert {"", "transformer.h.0.attn", "transformer.h.1.mlp", "lm_head"} <= set(rows), sorted(rows)

"""Checkpointed modules in the layer rows: a real ``memscope attach`` of a script that checkpoints
its blocks (or the whole model) with ``torch.utils.checkpoint``, reentrant and not, two
micro-batches per optimizer step, at default options.

What checkpointing keeps for backward is the checkpointed function's input; the row of the
module that receives it (the checkpointed block) shows those bytes, the modules inside it save
nothing, every row is a module that ran (one call per micro-batch), and what the blocks
recompute during backward is neither a call nor a saving.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import cli, memscope, report_json

F32 = 4
B = 16

SCRIPT = """
import sys
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

kind, where = sys.argv[1], sys.argv[2]  # reentrant | non_reentrant, blocks | model
reentrant = kind == "reentrant"
torch.manual_seed(0)


def block():
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(block() for _ in range(2))
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = checkpoint(b, h, use_reentrant=reentrant) if where == "blocks" else b(h)
        return self.head(h)


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    for micro in range(2):
        # a reentrant checkpoint of the whole model needs an input that requires grad
        x = torch.randn(16, 16, requires_grad=reentrant and where == "model")
        out = checkpoint(model, x, use_reentrant=reentrant) if where == "model" else model(x)
        out.pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def attach(tmp_path: Path, kind: str, where: str) -> Path:
    script = tmp_path / "ckpt.py"
    script.write_text(SCRIPT)
    db = tmp_path / f"{kind}-{where}.db"
    out = memscope("attach", "--headless", "--db", str(db), str(script), kind, where, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr  # nothing memscope does makes torch warn
    return db


def modules(db: Path) -> dict[str, dict[str, Any]]:
    out = cli("layers", str(db), "--json")
    assert out.returncode == 0, out.stderr
    layers = json.loads(out.stdout)
    assert layers["micro_batches"] == 2
    return {m["module"]: m for m in layers["modules"]}


def check_common(db: Path, rows: dict[str, dict[str, Any]]) -> None:
    # no pseudo-rows: every row but <no module> is a module of the model, called once per
    # micro-batch (the recomputation in backward is no call)
    assert not [m for m in rows if m.startswith("<") and m != "<no module>"], sorted(rows)
    assert all(r["calls"] == 1 for m, r in rows.items() if m != "<no module>"), rows
    assert rows["<no module>"]["activation_bytes"] == B * 4 * F32  # the loss's pow: its input
    report = report_json(db)
    # what the rows say is kept is within the step's activations at their peak
    assert sum(r["activation_bytes"] for r in rows.values()) <= report["peak"]["breakdown"]["activations"]


@pytest.mark.parametrize("kind", ["non_reentrant", "reentrant"])
def test_checkpointed_blocks_show_their_kept_input(tmp_path: Path, kind: str) -> None:
    rows = modules(attach(tmp_path, kind, "blocks"))
    expected = {f"blocks.{i}{sub}" for i in (0, 1) for sub in ("", ".0", ".1", ".2")}
    assert expected | {"", "stem", "head", "<no module>"} == set(rows)
    for i in (0, 1):
        assert rows[f"blocks.{i}"]["activation_bytes"] == B * 32 * F32, rows[f"blocks.{i}"]
        assert rows[f"blocks.{i}"]["type"] == "Sequential"
        for sub in (0, 1, 2):  # recomputed in backward: they keep nothing across it
            assert rows[f"blocks.{i}.{sub}"]["activation_bytes"] == 0
    assert rows[""]["activation_bytes"] == 0  # the caller is not charged for the blocks' input
    assert rows["stem"]["activation_bytes"] == B * 16 * F32
    assert rows["head"]["activation_bytes"] == B * 32 * F32
    check_common(tmp_path / f"{kind}-blocks.db", rows)


@pytest.mark.parametrize("kind", ["non_reentrant", "reentrant"])
def test_checkpointed_model_shows_its_kept_input(tmp_path: Path, kind: str) -> None:
    """checkpoint(model, x) in the training loop: the model's own row keeps x."""
    rows = modules(attach(tmp_path, kind, "model"))
    assert {"", "stem", "blocks.0", "blocks.1.2", "head"} <= set(rows)
    assert rows[""]["activation_bytes"] == B * 16 * F32 and rows[""]["type"] == "Net"
    assert all(r["activation_bytes"] == 0 for m, r in rows.items() if m not in ("", "<no module>"))
    check_common(tmp_path / f"{kind}-model.db", rows)

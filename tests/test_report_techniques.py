"""A run changed by ``attach --try`` says so in the report: its numbers are of the changed training."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import cli, memscope

SCRIPT = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(3):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(type(opt).__name__)
"""


def test_report_names_the_techniques_applied(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    db = tmp_path / "run.db"
    out = memscope("attach", "--headless", "--try", "lighter_optimizer", "--db", str(db), str(script))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("SGD")  # the technique really ran (AdamAsSGD)
    text = cli("report", str(db))
    assert text.returncode == 0, text.stderr
    line = next(ln for ln in text.stdout.splitlines() if ln.startswith("applied"))
    assert "lighter_optimizer" in line and "--try" in line
    doc = json.loads(cli("report", str(db), "--json").stdout)
    assert doc["run"]["techniques"] == [{"technique": "lighter_optimizer", "applied": True}]

    plain = tmp_path / "plain.db"
    assert memscope("attach", "--headless", "--db", str(plain), str(script)).returncode == 0
    assert json.loads(cli("report", str(plain), "--json").stdout)["run"]["techniques"] == []
    assert "applied" not in cli("report", str(plain)).stdout

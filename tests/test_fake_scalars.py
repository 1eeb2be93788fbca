"""What training scripts do with scalars, in a fake run (issue 23, item 2): format specs on 0-dim
tensors (ng-video-lecture's ``f"{losses['train']:.4f}"``), ``float()``/``int()``/``bool()``,
comparisons, ``.item()``, ``.tolist()``, numpy, ``math``, CSV logging all get a plausible
stand-in value and the estimate completes; a script that truly cannot go on is one line naming
its line, why, and ``--measure``."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import memscope

SCALARS = '''
import csv, math, sys
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F

model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
best = float("inf")
log = csv.writer(open("metrics.csv", "w", newline=""))

@torch.no_grad()
def estimate_loss():  # ng-video-lecture's
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(3)
        for k in range(3):
            losses[k] = F.cross_entropy(model(torch.randn(4, 32)), torch.randint(0, 4, (4,))).item()
        out[split] = losses.mean()
    return out

for step in range(5):
    logits = model(torch.randn(16, 32))
    loss = F.cross_entropy(logits, torch.randint(0, 4, (16,)))
    opt.zero_grad(); loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses = estimate_loss()
    print(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    print(f"{loss:e} {loss:>8.3f} {loss:.2%} {loss:g} {gn:.3f} {loss}")
    print("%.4f %d" % (loss, torch.tensor(3)), "{:.3f}".format(loss))
    f, i, b = float(loss), int(logits.argmax()), bool(loss > 0)
    assert isinstance(f, float) and isinstance(i, int) and isinstance(b, bool)
    if loss < best:
        best = loss.item()
    ppl, lg, sq = math.exp(loss), math.log(loss.item()), math.sqrt(float(loss))
    inv = 1.0 / loss.item()
    acc = (logits.argmax(1) == 0).float().mean().item()
    rows = logits.tolist()
    assert len(rows) == 16 and len(rows[0]) == 4
    arr = logits.detach().numpy()
    assert arr.shape == (16, 4) and float(np.mean(arr)) == float(np.mean(arr))
    log.writerow([step, loss.item(), acc, ppl, lg, sq, inv, round(loss.item(), 3), f"{gn:.3f}"])
    if math.isnan(loss.item()) or not math.isfinite(f):
        raise SystemExit("loss is nan")
'''


def test_scalars_get_stand_in_values_and_the_estimate_completes(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCALARS)
    out = memscope("estimate", "--json", "train.py", cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr
    est = json.loads(out.stdout)
    assert est["parameters"] == 4 * (32 * 64 + 64 + 64 * 4 + 4)
    sites = {p["site"].split(":")[0] + ":" + p["site"].split(":")[1] for p in est["placeholders"]}
    assert "train.py:30" in sites  # the f-string with :.4f on a 0-dim tensor
    assert not (tmp_path / "metrics.csv").exists()  # and the CSV went to the scratch directory
    assert [d["ops"] for d in est["diverted"]] == [["open('w')"]]


def test_a_script_that_cannot_go_on_says_its_line_why_and_measure(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    loss = m(torch.randn(2, 4)).pow(2).mean()\n"
        "    assert loss.item() < 0.5, 'diverged'\n"
        "    loss.backward(); opt.step(); opt.zero_grad()\n")
    out = memscope("estimate", "train.py", cwd=tmp_path, timeout=240)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "train.py:5: AssertionError: diverged" in out.stderr
    assert "the script read 1 value from tensors, which a fake run does not have" in out.stderr
    assert "memscope estimate --measure runs real steps on CPU instead" in out.stderr

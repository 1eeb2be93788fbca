"""The exact live-tensor counters against an independent truth: the CPU allocator as
torch.profiler records it (every allocation and free, with the allocator's running total).

whatif's counter (TensorPeak, also the "measured" side of the fake estimate's accuracy table)
finds storages through gc and a dispatch mode; the profiler sees the allocator itself. A sparse
embedding step is the case that once told them apart: its gradient is a sparse COO tensor, which
has no storage of its own, and both of memscope's counters left it out the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, memscope

TRUTH = ROOT / "tests" / "scripts" / "profiler_truth.py"
SPARSE = '''
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(5000, 64, sparse=True), nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    idx, y = torch.randint(0, 5000, (256,)), torch.randint(0, 10, (256,))
    loss = F.cross_entropy(model(idx), y)
    opt.zero_grad(); loss.backward(); opt.step()
'''


def truth(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(TRUTH), *args], capture_output=True, text=True,
                         timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout))


@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_the_live_tensor_counter_is_the_allocator_to_the_byte(mode: str) -> None:
    """At the step's start and at its peak, the counter's bytes are the allocator's."""
    got = truth(mode)
    assert got["counter"] == got["allocator"], got
    assert got["uncounted"] == 0


def test_leaving_sparse_tensors_out_shows_against_the_allocator() -> None:
    """The same sparse step counted as before (sparse tensors skipped): short of the allocator
    by the gradient's indices and values (256 x int64 + 256 x 64 float32 = 67,584 B) at the start."""
    got = truth("sparse", "--skip-sparse")
    assert got["allocator"][0] - got["counter"][0] == 256 * 8 + 256 * 64 * 4, got
    assert got["counter"][1] < got["allocator"][1]


def test_a_fake_estimate_says_it_did_not_count_sparse_tensors(tmp_path: Path) -> None:
    """A fake run cannot know a sparse tensor's size (how many values it holds depends on the
    data): the estimate says so instead of silently leaving it out."""
    script = tmp_path / "sparse.py"
    script.write_text(SPARSE)
    out = memscope("estimate", "--json", str(script), timeout=180)
    assert out.returncode == 0, out.stderr
    notes = json.loads(out.stdout)["notes"]
    assert any("sparse tensor(s) not counted" in n for n in notes), notes

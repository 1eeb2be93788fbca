"""Device-aware fake estimates (issue 23, item 3): tensors a script keeps on the CPU are host
memory, not GPU memory. A ng-video-lecture-style script keeps its whole dataset (16 MB of
int64 tokens) on the CPU and moves each batch and the model to the (pretend) GPU; the GPU peak
excludes the dataset, the host peak holds it, both are in ``peak_by_device``. The batches are
cut with ``data[i:i + block]`` for ``i`` in a fake index tensor: ``i + block`` is computed from
the placeholder of ``i`` (memscope.agent.fake.fake_values), so the batches are full-sized."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import memscope

SCRIPT = '''
import torch, torch.nn as nn, torch.nn.functional as F
device = "cuda" if torch.cuda.is_available() else "cpu"
data = torch.randint(0, 65, (2_000_000,), dtype=torch.long)  # the dataset, on the CPU by design
block, batch = 64, 16

def get_batch():
    ix = torch.randint(len(data) - block, (batch,))
    x = torch.stack([data[i:i + block] for i in ix])
    y = torch.stack([data[i + 1:i + block + 1] for i in ix])
    return x.to(device), y.to(device)

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(65, 128)
        self.mlp = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))
        self.head = nn.Linear(128, 65)

    def forward(self, idx, targets):
        logits = self.head(self.mlp(self.emb(idx)))
        return F.cross_entropy(logits.view(-1, 65), targets.view(-1))

model = Model().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(5):
    x, y = get_batch()
    assert x.shape == (batch, block), x.shape
    loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    print(f"step {step}: loss {loss.item():.4f}")
'''
DATASET = 2_000_000 * 8
PARAMS = 4 * (65 * 128 + 128 * 512 + 512 + 512 * 128 + 128 + 128 * 65 + 65)


@pytest.fixture(scope="module")
def estimate(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("devices")
    (d / "gpt.py").write_text(SCRIPT)
    out = memscope("estimate", "--json", "gpt.py", cwd=d, timeout=240)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_gpu_peak_excludes_the_cpu_dataset(estimate: dict[str, Any]) -> None:
    gpu, host = estimate["peak_by_device"]["cuda"], estimate["peak_by_device"]["cpu"]
    assert estimate["tensor_peak"] == gpu["peak_bytes"] and estimate["allocator_peak"] == gpu["peak_rounded_bytes"]
    assert gpu["peak_bytes"] < DATASET  # the dataset is bigger than everything on the GPU
    # the GPU holds the model's states and the step: parameters, gradients, AdamW's two moments
    assert gpu["breakdown"]["parameters"] == PARAMS and gpu["breakdown"]["optimizer_state"] >= 2 * PARAMS
    assert sum(gpu["breakdown"].values()) == gpu["peak_bytes"]
    # the host holds the dataset (and the model before .to(device), as a real run would)
    assert DATASET <= host["peak_bytes"] <= DATASET + PARAMS + (1 << 20)
    assert host["breakdown"]["other"] >= DATASET


def test_batches_cut_by_fake_indices_are_full_sized(estimate: dict[str, Any]) -> None:
    # the embedding's output (16 x 64 x 128 float32) is saved by the first Linear, etc.
    acts = {m["module"]: m["saved_bytes"] for m in estimate["modules"]}
    assert acts["mlp.0"] == 16 * 64 * 128 * 4 and acts["mlp.1"] == 16 * 64 * 512 * 4
    assert estimate["activations"] >= 16 * 64 * (128 + 512 + 512 + 128) * 4


def test_the_text_shows_host_tensors_apart(tmp_path: Path) -> None:
    (tmp_path / "gpt.py").write_text(SCRIPT)
    out = memscope("estimate", "gpt.py", cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith("host tensors"))
    assert "MiB" in line and "not in the GPU figures" in line

"""attach's agent starts as ``import torch`` ends, before the script has built anything: it then
finds its tensors and names its layers without walking the heap (memscope.agent.torchcompat.
module_parents, ``LiveTensors.install(fresh=True)``). A real training whose script counts every
``gc.get_referrers`` call and every ``gc.get_objects()`` of all generations, from before torch's
import to its end; what the run file says must still be exact."""

from __future__ import annotations

import textwrap
from pathlib import Path

from conftest import cli, memscope, report_json

SCRIPT = textwrap.dedent("""
    import gc
    calls = {"referrers": 0, "all objects": 0}
    real_referrers, real_objects = gc.get_referrers, gc.get_objects
    def referrers(*objs):
        calls["referrers"] += 1
        return real_referrers(*objs)
    def objects(generation=None):
        if generation is None:
            calls["all objects"] += 1
            return real_objects()
        return real_objects(generation)
    gc.get_referrers, gc.get_objects = referrers, objects
    import torch
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
            self.head = nn.Linear(64, 8)
        def forward(self, x):
            return self.head(self.body(x))

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(4):
        loss = model(torch.randn(32, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("walks:", calls["referrers"], calls["all objects"])
""")
PARAMETER_BYTES = 4 * (64 * 256 + 256 + 256 * 64 + 64 + 64 * 8 + 8)


def test_no_heap_walk_and_exact_bytes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    db = tmp_path / "run.db"
    out = memscope("attach", "--headless", "-q", "--db", str(db), str(script))
    assert out.returncode == 0, out.stderr
    assert "walks: 0 0" in out.stdout, out.stdout  # referrer walks, walks of every object
    report = report_json(db)
    assert report["leak_check"]["inventories"] >= 2
    breakdown = report["peak"]["breakdown"]
    assert breakdown["parameters"] == PARAMETER_BYTES and breakdown["gradients"] == PARAMETER_BYTES
    layers = cli("layers", str(db), "--step", "1")
    assert layers.returncode == 0, layers.stderr
    names = {line.split()[0] for line in layers.stdout.splitlines()[2:] if line.strip()}
    assert {"body.0", "body.1", "body.2", "head"} <= names, layers.stdout

"""``memscope estimate --measure SCRIPT.py``: the GPU peak predicted from two real steps on CPU
(the default fake run: tests/test_fake_estimate.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, memscope
from memscope.runners.script_estimate import CUDA_CONTEXT_ALLOWANCE

MLP = '''
import sys, torch, torch.nn as nn, torch.nn.functional as F
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
steps = int(sys.argv[1])
for step in range(steps):
    loss = F.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 4, (16,)))
    opt.zero_grad()
    loss.backward()
    opt.step()
print("all steps done", flush=True)
'''
PARAM_BYTES = 4 * (32 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4)
PARAM_TENSORS = 6


def test_estimate_sums_the_measured_breakdown(tmp_path: Path) -> None:
    script = tmp_path / "mlp.py"
    script.write_text(MLP)
    out = memscope("estimate", "--measure", "--json", str(script), "100")
    assert out.returncode == 0, out.stderr
    est = json.loads(out.stdout)
    assert est["schema"] == "memscope.estimate/1" and est["step"] == 1
    assert est["method"] == "measured"
    assert est["parameters"] == PARAM_BYTES and est["gradients"] == PARAM_BYTES
    # Adam: exp_avg and exp_avg_sq per parameter, and a float32 step scalar per tensor
    assert est["optimizer_state"] == 2 * PARAM_BYTES + 4 * PARAM_TENSORS
    assert est["activations"] > 0
    parts = sum(est[k] for k in ("parameters", "gradients", "optimizer_state", "activations"))
    assert est["sum_of_parts"] == parts
    # the allocator peak is the live-tensor peak the agent measured (issue #15: not the sum):
    # the parts plus temporaries, here the optimizer step's and the loss gradient
    assert est["allocator_peak"] == est["tensor_peak"] > parts
    assert est["device_total"] == est["allocator_peak"] + CUDA_CONTEXT_ALLOWANCE
    # the script was cut after 2 steps, not run for its 100
    import sqlite3

    conn = sqlite3.connect(est["db"])
    assert conn.execute("SELECT count(*) FROM steps").fetchone() == (2,)
    conn.close()


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """``estimate --measure`` printing its text, in a process that checks it never imported
    torch: one estimate for the text test and the no-torch test."""
    script = tmp_path_factory.mktemp("mlp") / "mlp.py"
    script.write_text(MLP)
    code = ("import sys, argparse\n"
            "from memscope.runners import script_estimate\n"
            f"rc = script_estimate.run(argparse.Namespace(script={str(script)!r}, script_args=['100'], measure=True))\n"
            "assert rc == 0\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_estimate_text_names_the_components(text_run: subprocess.CompletedProcess[str]) -> None:
    assert text_run.returncode == 0, text_run.stderr
    for word in ("parameters", "gradients", "optimizer state", "activations", "sum of the four",
                 "live-tensor peak", "allocator peak", "+ CUDA context", "512.00 MiB", "device total"):
        assert word in text_run.stdout


def test_a_script_that_hard_codes_cuda_is_said_in_one_line(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        return  # the script would run; nothing to say
    script = tmp_path / "cuda_only.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(4, 4).cuda()\n")
    out = memscope("estimate", "--measure", str(script))
    assert out.returncode == 2
    assert out.stderr.strip() == (f"memscope: error: estimate: {script} needs CUDA (it hard-codes "
                                  ".cuda() or device='cuda'), so it cannot be estimated on CPU")


def test_a_failing_script_and_a_script_without_steps(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nraise ValueError('broken data path')\n")
    out = memscope("estimate", "--measure", str(bad))
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "failed on CPU (exit 1): ValueError: broken data path" in out.stderr
    short = tmp_path / "short.py"
    short.write_text(MLP)
    out = memscope("estimate", "--measure", str(short), "1")  # one step: step 1 is never profiled
    assert out.returncode == 2 and "completed no profiled training step" in out.stderr


def test_the_estimating_process_never_imports_torch(text_run: subprocess.CompletedProcess[str]) -> None:
    assert text_run.returncode == 0, text_run.stderr  # its last line: torch not in sys.modules
    assert "allocator peak" in text_run.stdout

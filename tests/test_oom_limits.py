"""OOM under limits (issue 23, item 5). A real CPU run under an address-space limit
(``ulimit -v`` via RLIMIT_AS in the child) runs out of memory in step 0's forward, inside
ng-video-lecture-style attention heads whose N x N scores (softmax, dropout, scores @ v) are
most of what is live: ``memscope oom`` and ``report`` name RLIMIT_AS and its value, ``--json``
carries ``oom.limit``, the advice covers the attention scores, and the hint for a per-layer
profile of a step-0 failure is ``--layers-first 0``. Unit tests of the limit choice on records."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli
from memscope.analysis.oom_limits import failed_limit, profile_hint

ATTENTION = '''
import sys, torch, torch.nn as nn, torch.nn.functional as F
T, C, H, B = int(sys.argv[1]), 64, 4, 4

class Head(nn.Module):  # ng-video-lecture's: explicit scores, dropout on them
    def __init__(self, hs):
        super().__init__()
        self.key, self.query, self.value = (nn.Linear(C, hs, bias=False) for _ in range(3))
        self.register_buffer("tril", torch.tril(torch.ones(T, T)))
        self.dropout = nn.Dropout(0.2)

    def forward(self, x):
        b, t, c = x.shape
        k, q = self.key(x), self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        wei = wei.masked_fill(self.tril[:t, :t] == 0, float("-inf"))
        wei = self.dropout(F.softmax(wei, dim=-1))
        return wei @ self.value(x)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList(Head(C // H) for _ in range(H))
        self.proj = nn.Linear(C, C)

    def forward(self, x):
        return x + self.proj(torch.cat([h(x) for h in self.heads], dim=-1))

model = nn.Sequential(nn.Embedding(65, C), Block(), Block(), Block(), nn.Linear(C, 65))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randint(0, 65, (B, T))
    loss = F.cross_entropy(model(x).view(-1, 65), x.view(-1))
    opt.zero_grad(); loss.backward(); opt.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
'''
EXTRA = 1_000_000_000  # bytes of address space beyond what a small run of the script uses


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    d = tmp_path_factory.mktemp("limits")
    (d / "attn.py").write_text(ATTENTION + "import psutil; print('vms', psutil.Process().memory_info().vms)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    small = subprocess.run([sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(d / "small.db"),
                            str(d / "attn.py"), "64"], capture_output=True, text=True, env=env, timeout=300)
    assert small.returncode == 0, small.stderr
    limit = int(small.stdout.split("vms")[-1].split()[0]) + EXTRA

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    db = d / "oom.db"
    out = subprocess.run([sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db),
                          str(d / "attn.py"), "2048"], capture_output=True, text=True, env=env, timeout=300,
                         preexec_fn=cap)
    assert out.returncode == 1 and "can't allocate memory" in out.stderr, out.stderr[-2000:]
    return db, limit


@pytest.mark.slow
def test_the_failed_limit_is_named_with_its_value(run: tuple[Path, int]) -> None:
    db, limit = run
    oom = json.loads(cli("report", "--json", str(db)).stdout)["oom"]
    assert oom["step"] == 0 and oom["phase"] == "forward" and ".heads." in oom["module"]
    assert oom["limit"]["kind"] == "RLIMIT_AS" and oom["limit"]["bytes"] == limit
    assert oom["limit"]["used_bytes"] > limit // 2
    text = cli("oom", str(db)).stdout
    gib = f"{limit / 2 ** 30:.2f} GiB"
    assert f"limit     RLIMIT_AS (ulimit -v, counted against virtual size): {gib}" in text
    assert "% of the machine's" not in text  # the machine's memory is not what failed
    report = cli("report", str(db)).stdout
    assert f"over RLIMIT_AS (ulimit -v, counted against virtual size): {gib}" in report


@pytest.mark.slow
def test_the_advice_covers_attention_scores_and_the_step_0_profile(run: tuple[Path, int],
                                                                   tmp_path: Path) -> None:
    db, _ = run
    text = cli("oom", str(db)).stdout
    change = text[text.index("change"):]
    assert "attention scores" in change and "scaled_dot_product_attention" in change
    share = int(change.split("attention scores")[1].split("(")[1].split("%")[0])
    assert share >= 50  # softmax, dropout (output and mask) and scores @ v of each head
    report = json.loads(cli("report", "--json", str(db)).stdout)
    attention = [x for x in report["suggestions"] if x["technique"] == "efficient_attention"]
    assert attention and attention[0]["estimated_saving_bytes"] >= report["oom"]["breakdown"]["activations"] // 2
    layers = cli("layers", str(db))
    assert layers.returncode == 2 and "--layers-first 0" in layers.stderr
    html = tmp_path / "r.html"
    assert cli("report", str(db), "--html", str(html)).returncode == 0
    assert "attach with --layers-first 0 to profile step 0" in html.read_text()


def test_the_limit_choice() -> None:
    cpu = {"device": "cpu", "rss": 900, "vms": 1900, "requested_bytes": 200,
           "limits": {"RLIMIT_AS": 2000, "cgroup_memory_max": 5000, "host_memory": 10_000}}
    assert failed_limit(cpu) == {"kind": "RLIMIT_AS", "bytes": 2000, "used_bytes": 1900}
    cgroup = dict(cpu, rss=4900, vms=4900, limits={"cgroup_memory_max": 5000, "host_memory": 10_000})
    assert failed_limit(cgroup) == {"kind": "cgroup_memory_max", "bytes": 5000, "used_bytes": 4900}
    # nothing over by the figures: the tightest
    assert failed_limit(dict(cpu, requested_bytes=0, vms=1000))["kind"] == "RLIMIT_AS"
    assert failed_limit({"device": "cpu", "rss": 9_000, "host_total_bytes": 10_000,
                         "requested_bytes": 2_000})["kind"] == "host_memory"
    gpu = {"device": "cuda:0", "reserved_bytes": 7 << 30, "device_total_bytes": 80 << 30,
           "device_limit_bytes": 8 << 30, "limits": {"simulate_gpu": 8 << 30}}
    assert failed_limit(gpu) == {"kind": "simulate_gpu", "bytes": 8 << 30, "used_bytes": 7 << 30}
    assert failed_limit(dict(gpu, limits={}))["kind"] == "memory_fraction"
    assert failed_limit(dict(gpu, limits={}, device_limit_bytes=None))["kind"] == "cuda_device"
    assert failed_limit({"device": "cpu"}) is None


def test_the_profile_hint() -> None:
    assert "--layers-first 0" in profile_hint(0, 0)
    assert "--layers-first 0" in profile_hint(1, None)  # ended before step 1 completed
    assert profile_hint(40, 12) == "attach with --layers-every N"
    # no step completed and none failed: no option would have profiled anything
    for steps in (0, None):
        assert "--layers" not in profile_hint(steps, None) and "completed no training step" in profile_hint(steps, None)
    assert profile_hint(0, None, running=True) == "no training step has completed yet"

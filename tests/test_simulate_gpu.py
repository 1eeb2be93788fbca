"""``--simulate-gpu SIZE`` (issue #5): the size parser, the CPU path, and the real cap on CUDA."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from conftest import memscope, report_json
from memscope.units import parse_size

GIB = 1 << 30


@pytest.mark.parametrize("text, expected", [
    ("24GiB", 24 * GIB), ("24GB", 24 * 10**9), ("16G", 16 * GIB), ("16g", 16 * GIB),
    ("8000MiB", 8000 << 20), ("512M", 512 << 20), ("1.5GiB", 3 * GIB // 2), ("4096", 4096),
    ("2 TiB", 2 << 40), ("100kb", 100_000),
])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "24XB", "0", "0GiB", "-1GiB", "24 GiB extra", "1e3GB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


SCRIPT = '''
import torch, torch.nn as nn
model = nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
print("trained", flush=True)
'''


def test_bad_size_is_one_line_and_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = memscope("attach", "--db", str(tmp_path / "x.db"), "--simulate-gpu", "24XB", str(script))
    assert out.returncode == 2
    assert out.stderr.strip().startswith("memscope: error: attach: not a size: '24XB'")
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "x.db").exists()


def test_without_cuda_the_run_goes_on_with_a_warning(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the cap applies")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    db = tmp_path / "run.db"
    out = memscope("attach", "--db", str(db), "--headless", "--simulate-gpu", "24GiB", str(script))
    assert out.returncode == 0, out.stderr
    assert "trained" in out.stdout
    lines = [ln for ln in out.stderr.splitlines() if "simulate-gpu" in ln]
    assert lines == ["memscope: --simulate-gpu applies only on CUDA: no CUDA device here, the run "
                     "goes on without a memory cap"]
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT message, data FROM events WHERE kind = 'warning'").fetchall()
    options = conn.execute("SELECT options FROM processes").fetchone()[0]
    conn.close()
    assert len(rows) == 1 and rows[0][0].startswith("simulate_gpu:")
    assert str(24 * GIB) in rows[0][1]
    assert f'"simulate_gpu": {24 * GIB}' in options
    assert report_json(db)["run"]["steps"] == 3


CUDA_SCRIPT = '''
import sys, torch
gib = 1 << 30
x = torch.empty(gib // 2, dtype=torch.uint8, device="cuda")  # 0.5 GiB: under the 2 GiB cap
print("small ok", flush=True)
model = torch.nn.Linear(8, 8).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 8, device="cuda")).sum().backward()
opt.step()
big = torch.empty(3 * gib, dtype=torch.uint8, device="cuda")  # above the cap: OutOfMemoryError
print("big ok", flush=True)
'''


@pytest.mark.cuda
def test_cap_on_cuda_turns_an_allocation_above_it_into_a_recorded_oom(tmp_path: Path) -> None:
    import torch

    if torch.cuda.get_device_properties(0).total_memory < 8 * GIB:
        pytest.skip("needs a GPU of at least 8 GiB")
    script = tmp_path / "train.py"
    script.write_text(CUDA_SCRIPT)
    db = tmp_path / "run.db"
    out = memscope("attach", "--db", str(db), "--headless", "--simulate-gpu", "2GiB", str(script))
    assert out.returncode != 0
    assert "small ok" in out.stdout and "big ok" not in out.stdout
    assert "OutOfMemoryError" in out.stderr or "out of memory" in out.stderr
    conn = sqlite3.connect(db)
    capped = conn.execute("SELECT data FROM events WHERE kind = 'simulate_gpu'").fetchall()
    conn.close()
    assert capped and f'"simulate_gpu_bytes": {2 * GIB}' in capped[0][0]
    oom = report_json(db)["oom"]
    assert oom is not None and oom["requested_bytes"] >= 3 * GIB

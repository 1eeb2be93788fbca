"""Run files recorded by ``memscope attach`` on a real GPU (an H100, torch 2.11, 2026-11-24), read
on any machine: what memscope says about real CUDA runs (tests/data/README.md).

* ``cuda_run_nanogpt_real.db``: ``examples/scenarios/nanogpt.py --steps 30 --device cuda``; the
  same script run plain right after it reported ``torch.cuda.max_memory_allocated()`` =
  376,887,296 bytes.
* ``cuda_run_leak_real.db``: ``cuda_run_leak_real_script.py --steps 200`` (each step's loss kept
  in a list, on the GPU).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import cli

DATA = Path(__file__).parent / "data"
PLAIN_MAX_ALLOCATED = 376_887_296  # the plain run's max_memory_allocated, same machine and session


def copy(name: str, tmp_path: Path) -> Path:
    """A copy: reading a run file may add -wal/-shm files beside it; the checked-in one stays."""
    return Path(shutil.copy(DATA / name, tmp_path / name))


def test_the_attached_peak_is_the_plain_runs_max_memory_allocated(tmp_path: Path) -> None:
    db = copy("cuda_run_nanogpt_real.db", tmp_path)
    out = cli("report", str(db), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    run, peak = doc["run"], doc["peak"]
    assert run["device"] == "cuda:0" and run["torch"].endswith("+cu130") and run["steps"] == 30
    assert run["status"] == "finished" and run["dropped"] == 0
    # the agent changed nothing the allocator saw: the same peak, to the byte
    assert peak["bytes"] == PLAIN_MAX_ALLOCATED and peak["step"] == 1
    parts = peak["breakdown"]
    # nanoGPT's 10.77M float32 parameters (tied embeddings counted once), as many gradient bytes,
    # AdamW's two states a parameter (plus its step counters)
    assert parts["parameters"] == parts["gradients"] == 43_083_264
    assert 2 * parts["parameters"] <= parts["optimizer_state"] <= 2 * parts["parameters"] + 4096
    assert parts["activations"] > 0 and parts["other"] >= 0
    text = cli("report", str(db)).stdout
    assert "peak      359.43 MiB CUDA allocated at step 1" in text


def test_a_leak_on_the_gpu_is_reported_with_its_holder_and_line(tmp_path: Path) -> None:
    db = copy("cuda_run_leak_real.db", tmp_path)
    doc = json.loads(cli("report", str(db), "--json").stdout)
    assert doc["leak_check"]["verdict"] == "ok" and doc["run"]["steps"] == 200
    (leak,) = doc["leaks"]
    assert leak["held_by"] == "__main__.history" and leak["tensors_per_step"] == 1.0
    assert leak["site"].endswith("leak_cuda.py:11") and leak["created_at"].endswith("leak_cuda.py:9")
    assert leak["graph_nodes_per_step"] == 7.0 and leak["node_bytes_measured"] is False
    script = (DATA / "cuda_run_leak_real_script.py").read_text().splitlines()
    assert "history.append(loss)" in script[10] and "loss = " in script[8]  # lines 11 and 9
    text = cli("leaks", str(db)).stdout
    assert "LEAK  activations float32 [] MeanBackward0" in text and "store loss.item()" in text

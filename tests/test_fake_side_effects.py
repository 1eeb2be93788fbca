"""A fake run (``memscope estimate SCRIPT``, ``fit``) writes nothing of the user's (issue 23,
item 1): a training script that checkpoints with ``torch.save`` + ``os.replace``, appends to its
log, writes CSV and numpy files, renames, copies and removes files and directories runs to its
steps; every file it found is byte-identical afterwards (hashes), nothing new appears beside it,
and the estimate lists each path it diverted. The script reads back what it wrote (the
checkpoint, the log it appended to) and asserts on it, so a diverted write that a later read
did not see fails the run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import memscope

TRAIN = '''
import csv, os, shutil
from pathlib import Path
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F

model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
os.makedirs("out", exist_ok=True)
os.makedirs("runs/new", exist_ok=True)
for step in range(5):
    if step == 1:  # housekeeping (the fake run ends at the second optimizer step)
        os.rename("old.txt", "older.txt")
        assert open("older.txt").read() == "old\\n" and not os.path.exists("old.txt")
        os.remove("older.txt")
        Path("data/cache.bin").unlink()
        assert not Path("data/cache.bin").exists()
        shutil.rmtree("data")
        assert not os.path.isdir("data")
        Path("notes.md").touch()
        shutil.move("runs/new/w.npy", "runs/w_moved.npy")
        assert np.load("runs/w_moved.npy").shape == (3,)
    loss = F.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 4, (16,)))
    opt.zero_grad(); loss.backward(); opt.step()
    with open("train.log", "a") as f:  # appends to the user's log: the copy keeps its lines
        f.write(f"step {step} loss {loss.item():.4f}\\n")
    lines = open("train.log").read().splitlines()
    assert lines[0] == "old log line" and len(lines) == step + 2, lines
    # checkpoint mid-training, written atomically, then read back
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, "out/model.pt.tmp")
    os.replace("out/model.pt.tmp", "out/model.pt")
    assert not os.path.exists("out/model.pt.tmp") and os.path.getsize("out/model.pt") < 15000
    ck = torch.load("out/model.pt")
    assert ck["step"] == step and ck["model"]["0.weight"].shape == (64, 32), ck["step"]
    model.load_state_dict(ck["model"])
    Path("latest.txt").write_text(str(step))
    assert Path("latest.txt").read_text() == str(step)
    np.save("runs/new/w.npy", np.zeros(3))
    assert np.load("runs/new/w.npy").shape == (3,)
    shutil.copy("latest.txt", "runs/new/latest_copy.txt")
    with open("metrics.csv", "w", newline="") as f:
        csv.writer(f).writerow([step, loss.item()])
'''


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], dict[str, Any]]:
    """The user's directory, its hashes before, and the estimate's JSON."""
    d = tmp_path_factory.mktemp("user")
    (d / "train.py").write_text(TRAIN)
    (d / "out").mkdir()
    (d / "out" / "model.pt").write_bytes(b"a real checkpoint" * 1000)
    (d / "train.log").write_text("old log line\n")
    (d / "latest.txt").write_text("keep me\n")
    (d / "old.txt").write_text("old\n")
    (d / "notes.md").write_text("mine\n")
    (d / "data").mkdir()
    (d / "data" / "cache.bin").write_bytes(b"\x00" * 100)
    before = _hashes(d)
    out = memscope("estimate", "--json", "train.py", cwd=d, timeout=240)
    assert out.returncode == 0, out.stderr
    return d, before, json.loads(out.stdout)


def test_the_user_s_files_are_unchanged(user_dir: tuple[Path, dict[str, str], dict[str, Any]]) -> None:
    d, before, est = user_dir
    assert est["method"] == "fake" and est["parameters"] > 0
    assert _hashes(d) == before  # same files, same bytes, nothing added, nothing removed
    assert sorted(p.name for p in d.iterdir()) == sorted(["train.py", "out", "train.log", "latest.txt",
                                                           "old.txt", "notes.md", "data"])


def test_the_estimate_lists_what_it_diverted(user_dir: tuple[Path, dict[str, str], dict[str, Any]]) -> None:
    d, _, est = user_dir
    ops = {str(Path(x["path"]).relative_to(d.resolve())): x["ops"] for x in est["diverted"]}
    assert ops["out/model.pt.tmp"] == ["torch.save", "os.replace"]
    assert ops["out/model.pt"] == ["os.replace"]
    assert ops["train.log"] == ["open('a')"]
    assert ops["latest.txt"] == ["open('w')"]
    assert ops["metrics.csv"] == ["open('w')"]
    assert ops["runs/new"] == ["os.makedirs"]
    assert ops["runs/new/latest_copy.txt"] == ["shutil.copy"]
    assert "os.rename" in ops["old.txt"] and "os.remove" in ops["older.txt"]
    assert ops["data/cache.bin"] == ["os.unlink"] and ops["data"] == ["shutil.rmtree"]
    assert ops["runs/w_moved.npy"] == ["shutil.move"] and "shutil.move" in ops["runs/new/w.npy"]
    assert "notes.md" not in ops  # touching a user's file changes nothing: not a write
    assert "out" not in ops  # makedirs of a directory the user has is no write


def test_the_text_says_which_files(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for step in range(3):\n"
        "    m(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "    torch.save(m.state_dict(), 'ckpt.pt')\n")
    (tmp_path / "ckpt.pt").write_bytes(b"real")
    out = memscope("estimate", "train.py", cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr
    assert "files: the script wrote to 1 path; a fake run diverts every write" in out.stdout
    assert "    ckpt.pt (torch.save)" in out.stdout
    assert (tmp_path / "ckpt.pt").read_bytes() == b"real"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "train.py"]


SAFETENSORS = """
import torch
from safetensors.torch import load_file, save_file
m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(3):
    m(torch.randn(2, 8)).sum().backward(); opt.step(); opt.zero_grad()
    save_file(m.state_dict(), "model.safetensors")  # written from Rust, not through open()
    back = load_file("model.safetensors")
    assert back["weight"].shape == (8, 8), back
    m.load_state_dict(back)
"""


def test_safetensors_writes_are_diverted(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    (tmp_path / "train.py").write_text(SAFETENSORS)
    (tmp_path / "model.safetensors").write_bytes(b"the user's weights")
    out = memscope("estimate", "--json", "train.py", cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "model.safetensors").read_bytes() == b"the user's weights"
    diverted = json.loads(out.stdout)["diverted"]
    assert [d["ops"] for d in diverted] == [["safetensors.save_file"]]
    assert diverted[0]["notes"] == ["fake tensors: shapes kept, no file"]


def test_fit_writes_nothing_of_the_user_s_either(tmp_path: Path) -> None:
    """memscope fit runs the script through the same fake runs: its checkpoint stays as it was."""
    (tmp_path / "train.py").write_text(
        "import argparse, torch\n"
        "p = argparse.ArgumentParser(); p.add_argument('--batch-size', type=int, default=4)\n"
        "args = p.parse_args()\n"
        "m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8))\n"
        "opt = torch.optim.Adam(m.parameters())\n"
        "for step in range(3):\n"
        "    m(torch.randn(args.batch_size, 256)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "    torch.save(m.state_dict(), 'ckpt.pt')\n"
        "    with open('log.txt', 'a') as f:\n"
        "        f.write(f'{step}\\n')\n")
    (tmp_path / "ckpt.pt").write_bytes(b"real")
    (tmp_path / "log.txt").write_text("mine\n")
    before = _hashes(tmp_path)
    out = memscope("fit", "--gpu", "1GiB", "--json", "train.py", cwd=tmp_path, timeout=400)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plans"][0]["fits"]
    assert _hashes(tmp_path) == before

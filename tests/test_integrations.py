"""Lightning and Hugging Face callbacks, driven by the real frameworks on CPU in subprocesses.

Skipped when the framework is not installed (``pip install 'torch-memscope[integrations]'``).
Each script trains with gradient accumulation, so a step must be an optimizer step, not a batch;
each runs twice: the callback starting memscope itself, and under ``memscope attach`` where it
must join the running agent instead of starting a second one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from conftest import cli, memscope

LIGHTNING = '''
import json, sys
import torch, torch.nn as nn, torch.nn.functional as F
import lightning.pytorch as pl
from memscope.integrations.lightning import MemscopeCallback

db = sys.argv[1] if len(sys.argv) > 1 else None
try:  # a bad option fails when the callback is made, before any training
    MemscopeCallback(sample_hz=-1)
except ValueError as e:
    print("refused:", e)

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    def training_step(self, batch, i):
        x, y = batch
        return F.cross_entropy(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(80, 16), torch.randint(0, 2, (80,)))
loader = torch.utils.data.DataLoader(data, batch_size=8)   # 10 batches
trainer = pl.Trainer(max_epochs=1, accumulate_grad_batches=2, accelerator="cpu", devices=1,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[MemscopeCallback(db, name="tiny-lit")])
trainer.fit(Tiny(), loader)
print(json.dumps({"global_step": trainer.global_step}))
'''

HUGGINGFACE = '''
import json, sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from memscope.integrations.huggingface import MemscopeCallback

db, out_dir = (sys.argv[1] or None), sys.argv[2]

class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (24, 16), generator=g)
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
args = TrainingArguments(output_dir=out_dir, max_steps=4, per_device_train_batch_size=2,
                         gradient_accumulation_steps=3, use_cpu=True, report_to=[],
                         save_strategy="no", logging_strategy="no", disable_tqdm=True,
                         dataloader_num_workers=0)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(),
                  callbacks=[MemscopeCallback(db, name="tiny-gpt2")])
trainer.train()
print(json.dumps({"global_step": trainer.state.global_step}))
'''

FRAMEWORKS = {
    "lightning": ("lightning", LIGHTNING, "tiny-lit", 5),      # 10 batches / 2 per step
    "huggingface": ("transformers", HUGGINGFACE, "tiny-gpt2", 4),  # max_steps=4, 3 batches each
}


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install 'torch-memscope[integrations]')")


def facts(db: Path) -> dict[str, object]:
    with sqlite3.connect(db) as conn:
        return {
            "processes": conn.execute("SELECT count(*) FROM processes").fetchone()[0],
            "step_mode": conn.execute("SELECT step_mode FROM processes").fetchone()[0],
            "steps": [r[0] for r in conn.execute("SELECT step FROM steps WHERE status = 'ok' ORDER BY step")],
            "names": [json.loads(r[1]) | {"message": r[0]} for r in conn.execute(
                "SELECT message, data FROM events WHERE kind = 'run_name'")],
            "run_status": conn.execute("SELECT status FROM run").fetchone()[0],
        }


def last_json(stdout: str) -> dict[str, int]:
    return json.loads(stdout.strip().splitlines()[-1])


Started = tuple[Path, "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Started]:
    """framework -> its script run once with the callback starting memscope (the run file and
    the process): read by the test of that run and, for Lightning, by the bad-option test."""
    done: dict[str, Started] = {}

    def run(framework: str) -> Started:
        if framework not in done:
            module, source, _, _ = FRAMEWORKS[framework]
            needs(module)
            where = tmp_path_factory.mktemp(framework)
            script = where / "train.py"
            script.write_text(source)
            db = where / "run.db"
            env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
            argv = [sys.executable, str(script), str(db)] + ([str(where / "out")] if framework == "huggingface" else [])
            done[framework] = db, subprocess.run(argv, cwd=where, env=env, capture_output=True, text=True,
                                                 timeout=300)
        return done[framework]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_callback_starts_memscope(framework: str, started: Callable[[str], Started]) -> None:
    _, _, name, optimizer_steps = FRAMEWORKS[framework]
    db, out = started(framework)
    assert out.returncode == 0, out.stderr[-3000:]
    assert last_json(out.stdout)["global_step"] == optimizer_steps
    f = facts(db)
    # one memscope step per optimizer step (not per micro-batch), numbered from 0
    assert f["steps"] == list(range(optimizer_steps)), f
    assert f["step_mode"] == "manual" and f["processes"] == 1
    assert f["names"] == [{"message": name, "name": name, "framework": framework, "global_step": 0}]
    assert f["run_status"] == "finished"  # the callback started the run and stopped it
    report = cli("report", str(db), "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["run"]["steps"] == optimizer_steps


@pytest.mark.slow
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_callback_under_attach_only_marks_steps(framework: str, tmp_path: Path) -> None:
    module, source, name, optimizer_steps = FRAMEWORKS[framework]
    needs(module)
    script = tmp_path / "train.py"
    script.write_text(source)
    db = tmp_path / "attached.db"
    extra = ["", str(tmp_path / "out")] if framework == "huggingface" else []
    out = memscope("attach", "--headless", "--db", str(db), str(script), *extra, cwd=tmp_path,
                   env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert last_json(out.stdout)["global_step"] == optimizer_steps
    f = facts(db)
    assert f["processes"] == 1  # the attach agent only: no second agent, no second run file
    assert not list(tmp_path.glob("memscope-*.db"))
    assert f["steps"] == list(range(optimizer_steps)), f
    assert f["names"][0]["message"] == name
    assert f["run_status"] == "finished"


def test_bad_option_fails_at_construction(started: Callable[[str], Started]) -> None:
    """The Lightning script makes a callback with a bad option first (the run the test above
    reads): a ValueError at construction, which the script catches and prints."""
    _, out = started("lightning")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("refused: sample_hz must be between"), out.stdout[-3000:]

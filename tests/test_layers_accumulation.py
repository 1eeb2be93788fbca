"""Layer rows under gradient accumulation: one micro-batch, never the sum over the step.

A real ``memscope attach`` of a script that runs several forward/backward micro-batches per
``optimizer.step()`` (steps end there), at default options. The expected bytes are analytic:
``Linear`` saves its input, ``ReLU`` its output (which the next ``Linear`` saves again: counted
once), the loss's ``pow`` saves the model output (``<no module>``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import SCRIPTS, cli, memscope, report_json
from shared_runs import shared_attach

F32 = 4
D_IN, D_H = 256, 1024

SCRIPT_PATH = SCRIPTS / "accumulate.py"  # micro-batches of argv[1]'s sizes, 3 optimizer steps
SCRIPT = SCRIPT_PATH.read_text()


def attach(tmp_path_factory: pytest.TempPathFactory, sizes: str) -> Path:
    """tests/scripts/accumulate.py SIZES under attach at default options, made once per session
    (tests/shared_runs.py): docs/layers.md's sample and the dashboard read some of these runs too."""
    db, out = shared_attach(tmp_path_factory, [], ["tests/scripts/accumulate.py", sizes], timeout=300)
    assert out.returncode == 0, out.stderr
    return db


def saved_by(b: int) -> dict[str, int]:
    """What one forward of a micro-batch of ``b`` rows saves, per module."""
    return {"0": b * D_IN * F32, "1": b * D_H * F32, "<no module>": b * D_IN * F32}


def layers_json(db: Path) -> dict[str, Any]:
    out = cli("layers", str(db), "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


@pytest.mark.parametrize("sizes, largest", [("64,64,64,64", 64), ("16,64,32,8", 64)])
def test_hotspots_are_one_micro_batch(tmp_path_factory: pytest.TempPathFactory, sizes: str, largest: int) -> None:
    db = attach(tmp_path_factory, sizes)
    report = report_json(db)
    activations = report["peak"]["breakdown"]["activations"]
    spots = {h["module"]: h["activation_bytes"] for h in report["hotspots"]}
    # the rows are the micro-batch that saved the most, not 4 micro-batches summed
    assert spots == saved_by(largest)
    assert report["hotspots_micro_batches"] == 4 and report["hotspots_step"] == 1
    # so no hotspot exceeds the step's activations at their peak (what one micro-batch keeps)
    assert all(b <= activations for b in spots.values())
    assert sum(spots.values()) == activations
    layers = layers_json(db)
    assert layers["micro_batches"] == 4
    rows = {m["module"]: m for m in layers["modules"]}
    assert all(m["calls"] == 1 for name, m in rows.items() if name != "<no module>")
    # every figure is of that one micro-batch, also for modules that save nothing
    assert rows["1"]["output_bytes"] == largest * D_H * F32
    assert rows[""]["output_bytes"] == rows["2"]["output_bytes"] == largest * D_IN * F32
    # the tables say what a row is
    text = cli("layers", str(db)).stdout
    assert text.splitlines()[0].endswith("per micro-batch (4 in the step; the one that saved the most)")
    assert "per micro-batch (4 in the step" in cli("report", str(db)).stdout


def test_without_accumulation_nothing_changes(tmp_path_factory: pytest.TempPathFactory) -> None:
    db = attach(tmp_path_factory, "64")
    report = report_json(db)
    assert {h["module"]: h["activation_bytes"] for h in report["hotspots"]} == saved_by(64)
    assert report["hotspots_micro_batches"] == 1
    assert "micro-batch" not in cli("layers", str(db)).stdout
    assert "micro-batch" not in cli("report", str(db)).stdout


TWO_MODELS = """
import torch
import torch.nn as nn

torch.manual_seed(0)
actor = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 8))
critic = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 1))
opt = torch.optim.SGD([*actor.parameters(), *critic.parameters()], lr=0.01)
for step in range(3):
    obs = torch.randn(32, 64)
    actor(obs).logsumexp(-1).mean().backward()  # each model's own forward and backward
    critic(obs).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_model_outside_the_largest_micro_batch_keeps_its_rows(tmp_path: Path) -> None:
    """Two forward/backward passes per step through different models (an actor and a critic):
    the rows are the larger pass's, and the other model's modules keep theirs."""
    script = tmp_path / "two_models.py"
    script.write_text(TWO_MODELS)
    db = tmp_path / "two.db"
    out = memscope("attach", "--headless", "--db", str(db), str(script), timeout=300)
    assert out.returncode == 0, out.stderr
    layers = layers_json(db)
    assert layers["micro_batches"] == 2
    saved = {m["module"]: m["activation_bytes"] for m in layers["modules"]}
    assert saved["1"] == 32 * 512 * F32  # the actor's ReLU output
    assert saved["Sequential:1"] == 32 * 128 * F32  # the critic's Tanh output, from its own pass
    assert saved["Sequential:0"] == saved["0"] == 32 * 64 * F32  # each first Linear's input


def test_accumulation_advice_counts_the_micro_batches_already_there(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A script that already accumulates 2 micro-batches is told to go to 4, not to start
    accumulating; the same batch in one forward is told to start."""
    def advice(sizes: str) -> str:
        doc = report_json(attach(tmp_path_factory, sizes))
        (s,) = [s for s in doc["suggestions"] if s["technique"] == "gradient_accumulation"]
        return str(s["how"])

    already = advice("1024,1024")
    assert "already accumulates 2 micro-batches" in already and "accumulate 4" in already
    fresh = advice("2048")
    assert "already" not in fresh and "every 2 micro-batches" in fresh


WHATIF = {"max_steps": 3, "layers_every": 1, "layers_first": 1, "inventory_every": 0, "tensor_peak": True}


def test_the_accumulation_figure_is_what_splitting_the_micro_batch_saves(tmp_path: Path) -> None:
    """Recorded as ``memscope whatif`` records its baseline (the exact live-tensor peak), one
    micro-batch of 2048 rows, two of 1024, four of 512 (zero_grad at the step's end). From one
    to two, the figure takes off the gradients the second micro-batch keeps live (missing from
    the first's peak); from two to four it does not: the script peaks in its second micro-batch,
    gradients live already. Each figure within 5% of the saving measured (-4% and 0%; with the
    gradients taken off from two to four, -15%)."""
    from memscope.analysis.suggestions import suggest
    from memscope.runners.script_estimate import run_recorded
    from memscope.store.reader import RunReader

    script = tmp_path / "accumulate.py"
    script.write_text(SCRIPT)
    peaks, figures = {}, {}
    for sizes in ("2048", "1024,1024", "512,512,512,512"):
        db = str(tmp_path / f"whatif-{sizes.replace(',', '-')}.db")
        child = run_recorded(str(script), [sizes], db, WHATIF)
        assert child.ok, child.last_error()
        with RunReader(db) as reader:
            peaks[sizes] = max(int(e["data"]["peak_bytes"]) for e in reader.events("tensor_peak"))
            figures[sizes] = {s.technique: s.estimated_saving_bytes for s in suggest(reader)}
    for before, after in (("2048", "1024,1024"), ("1024,1024", "512,512,512,512")):
        measured = peaks[before] - peaks[after]
        figure = figures[before]["gradient_accumulation"]
        assert measured > 1 << 20 and abs(figure - measured) <= 0.05 * measured, (before, figure, measured)

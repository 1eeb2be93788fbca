"""``memscope fit`` plans selective checkpointing (issue #25): on tiny_gpt at a budget between
its peak as it is and its peak with whole-block checkpointing, a selective plan that fits with
fewer recompute FLOPs than whole-block checkpointing is among the plans, as the
``memscope.fit/1`` technique object, its peak from a fake run with the policy applied."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 7.5 * 2 ** 20  # tensors only (no context, no fragmentation allowance)


@pytest.mark.slow
def test_fit_includes_a_selective_plan_between_none_and_whole_block() -> None:
    proc = subprocess.run([sys.executable, "-m", "memscope", "fit", "--gpu", "7.5MiB", "--cuda-context", "0",
                           "--fragmentation", "0", "--json", str(ROOT / "examples" / "tiny_gpt.py"), "--steps", "4"],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "memscope.fit/1" and doc["budget_bytes"] == BUDGET
    plans = doc["plans"]
    as_is = next(p for p in plans if not p["techniques"])
    assert not as_is["fits"] and as_is["peak_bytes"] > BUDGET

    selective = [p for p in plans if p["fits"]
                 and [t["technique"] for t in p["techniques"]] == ["selective_checkpointing"]]
    assert len(selective) == 1
    plan = selective[0]
    tech = plan["techniques"][0]
    assert tech == {"technique": "selective_checkpointing", "blocks": ["blocks.0", "blocks.1"],
                    "save": ["aten.addmm"], "recompute_flops_pct": pytest.approx(14.29)}
    # whole-block checkpointing recomputes more (alone it is ranked out here: accumulation over
    # 2 micro-batches saves more for less; it stays in the plans with autocast)
    whole = [p for p in plans if any(t["technique"] == "activation_checkpointing" and len(t["blocks"]) == 2
                                     for t in p["techniques"])]
    assert whole and all(_flops(plan["cost"]) < _flops(w["cost"]) for w in whole)
    # the cheapest plan that fits
    assert next(p for p in plans if p["fits"]) == plan


def _flops(cost: str) -> int:
    """The extra FLOPs in a plan's cost, "+4% FLOPs (recompute)" -> 4."""
    return int(cost.split("+", 1)[1].split("%", 1)[0])

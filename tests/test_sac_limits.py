"""Where selective checkpointing may not apply (issue #25): a block whose activation is a custom
``torch.autograd.Function``, and a model under ``torch.compile``. Either the plan is applied and
the training computes what it computed without it (the same loss at every step), or it is
refused with a reason; never a crash, never a line of memscope's in the script's output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "sac_limits.py"


def _whatif(tmp: Path, *flags: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "memscope", "whatif", "--try", "selective_checkpointing",
                           "--steps", "3", "--db-dir", str(tmp), "--json", str(SCRIPT), *flags, "--steps", "5"],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def _logs(tmp: Path) -> tuple[str, str]:
    return ((tmp / "whatif-sac_limits-baseline.log").read_text(),
            (tmp / "whatif-sac_limits-selective_checkpointing.log").read_text())


def _losses(log: str) -> int:
    return sum(line.startswith("step ") for line in log.splitlines())


@pytest.mark.slow
def test_a_custom_autograd_function_is_planned_and_applied(tmp_path: Path) -> None:
    """The profile sees the Function's aten ops and what it saves; the plan keeps the matmuls
    and recomputes the Function; the losses are the baseline's, the peak lower, as predicted."""
    doc = _whatif(tmp_path, "--custom-fn")
    sel = doc["selective_checkpointing"]
    assert sel["plan"]["save"] == ["aten.addmm"] and sel["plan"]["blocks"] == ["blocks.0", "blocks.1", "blocks.2"]
    trial = doc["trials"][0]
    assert trial["applied"] is True
    assert sel["measured_peak_bytes"] < sel["baseline_peak_bytes"]
    assert sel["predicted_peak_bytes"] == pytest.approx(sel["measured_peak_bytes"], rel=0.05)
    base, tried = _logs(tmp_path)
    assert _losses(base) == 2 and tried == base  # the same losses, and nothing else printed


@pytest.mark.slow
def test_a_compiled_model_is_refused_with_a_reason(tmp_path: Path) -> None:
    """Under torch.compile (aot_eager) neither the profile nor the plan touches the model: the
    trial says why, whatif says there is no plan and why, and the script's output is the
    baseline's (torch's checkpoint-under-compile warning is not printed into it)."""
    doc = _whatif(tmp_path, "--compile")
    trial = doc["trials"][0]
    assert trial["applied"] is False
    why = [h.get("why", "") for h in trial["how"]]
    assert any("torch.compile" in w for w in why), trial["how"]
    sel = doc["selective_checkpointing"]
    assert sel["plan"] is None and "torch.compile" in sel["why"]
    base, tried = _logs(tmp_path)
    assert _losses(base) == 2 and tried == base
    assert "context_fn" not in tried

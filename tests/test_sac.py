"""Selective checkpointing (issue #25): the op-level block profile, the plan curve, the recompute
FLOPs it predicts against FlopCounterMode's count of a real checkpointed backward, and
``memscope whatif --try selective_checkpointing`` (predicted peak against the measured one)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

from memscope.agent.whatif.sac_apply import policy_for
from memscope.agent.whatif.sac_profile import BlockProfile, flop_mapping
from memscope.analysis import sac_plan
from memscope.analysis.suggestions import suggest
from memscope.store.reader import RunReader

ROOT = Path(__file__).resolve().parent.parent


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem + "_sac", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tiny_gpt() -> tuple[Any, tuple[Any, ...]]:
    mod = _load(ROOT / "examples" / "tiny_gpt.py")
    torch.manual_seed(0)
    model = mod.TinyGPT(256, 64, 4, 2, 64)
    return model.blocks[0], (torch.randn(4, 64, 64, requires_grad=True),)


def _nanogpt() -> tuple[Any, tuple[Any, ...]]:
    mod = _load(ROOT / "examples" / "scenarios" / "nanogpt.py")
    torch.manual_seed(0)
    return mod.Block(128, 4, 0.2), (torch.randn(2, 64, 128, requires_grad=True),)


def _llama() -> tuple[Any, tuple[Any, ...]]:
    mod = _load(ROOT / "tests" / "scripts" / "llama_block.py")
    torch.manual_seed(0)
    model = mod.Llama(128, 96, 4, 1, 64)
    return model.layers[0], (torch.randn(2, 64, 96, requires_grad=True), model.cos, model.sin)


def _counted(block: Any, args: tuple[Any, ...], save: list[str] | None) -> int:
    """FLOPs of one forward + backward, counted by torch's FlopCounterMode."""
    def fwd() -> Any:
        if save is None:
            return block(*args)
        ctx = functools.partial(create_selective_checkpoint_contexts, policy_for(save))
        return checkpoint(block, *args, use_reentrant=False, context_fn=ctx)

    torch.manual_seed(1)
    with FlopCounterMode(display=False, custom_mapping=flop_mapping()) as counter:
        fwd().sum().backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("build", [_tiny_gpt, _nanogpt, _llama], ids=["tiny_gpt", "nanogpt", "llama"])
def test_recompute_flops_match_the_counted_ones(build: Any) -> None:
    """For every plan on the curve, the recompute FLOPs predicted from the profile equal the
    extra FLOPs FlopCounterMode counts in a real checkpointed forward + backward (within 5%),
    and what the profile saw matches autograd (a plan that keeps every FLOP op recomputes 0)."""
    block, args = build()
    prof = BlockProfile()
    torch.manual_seed(1)
    prof.record(block, *args)
    data = {"container": "blocks", "block_type": type(block).__name__, "blocks": 1, **prof.as_json()}
    p = sac_plan.parse_profile(json.loads(json.dumps(data)))
    assert p.saved_bytes > 0 and p.forward_flops > 0
    base = _counted(block, args, None)
    plans = [pt for pt in sac_plan.curve(p) if pt.save is not None]
    assert len(plans) >= 3  # whole-block, and at least two selective plans
    for pt in plans:
        extra = _counted(block, args, list(pt.save or ()))
        assert extra - base == pytest.approx(pt.recompute_flops, rel=0.05, abs=1), pt.label
    whole = next(pt for pt in plans if pt.save == ())
    assert whole.recompute_flops > 0 and whole.kept_bytes == 0
    assert sac_plan.selective_default(p).recompute_flops == 0


def _profile(ops: list[tuple[str, int, list[int]]], sizes: list[int], saved: list[int], blocks: int = 4) -> Any:
    return sac_plan.parse_profile({
        "container": "h", "block_type": "B", "blocks": blocks, "last_pack": len(ops),
        "ops": [{"op": o, "flops": f, "out": out} for o, f, out in ops],
        "storages": [{"bytes": b, "made": True} for b in sizes], "saved": saved})


def test_curve_is_a_pareto_front_with_both_ends() -> None:
    p = _profile([("aten.mm", 100, [0]), ("aten.gelu", 0, [1]), ("aten.bmm", 10, [2]),
                  ("aten._softmax", 0, [3])], [40, 40, 200, 200], [0, 1, 2, 3])
    pts = sac_plan.curve(p)
    assert pts[0].label == "no checkpointing" and pts[0].activation_bytes == 480 * 4
    assert pts[-1].activation_bytes == 0 and pts[-1].recompute_flops == 110 * 4  # whole-block
    keep_mm = next(pt for pt in pts if pt.save == ("aten.mm",))
    assert keep_mm.activation_bytes == 160 and keep_mm.recompute_flops == 40
    assert pts[1].save == ("aten.bmm", "aten.mm") and pts[1].recompute_flops == 0  # dominates no ckpt
    for a, b in zip(pts[1:], pts[2:]):  # less memory costs more recompute along the front
        assert b.activation_bytes < a.activation_bytes and b.recompute_flops > a.recompute_flops
    # keeping the bmm (big output, few FLOPs) is dominated by whole-block on the first j blocks
    assert all(pt.save != ("aten.bmm",) for pt in pts)
    assert sac_plan.best_under(p, 200).save == ("aten.mm",)  # type: ignore[union-attr]
    assert sac_plan.suggested(p).save == ("aten.mm",)  # least kept at <= half whole-block's FLOPs


def test_predicted_peak_takes_the_higher_of_forward_and_recompute() -> None:
    p = _profile([("aten.mm", 100, [0]), ("aten.gelu", 0, [1])], [100, 300], [0, 1], blocks=3)
    whole = sac_plan.point(p, frozenset())
    keep = sac_plan.point(p, frozenset({"aten.mm"}))
    assert sac_plan.predicted_peak(5000, 4800, p, whole) == max(5000 - 1200, 4800 - 2 * 400)
    assert sac_plan.predicted_peak(5000, 4000, p, keep) == 5000 - 3 * 300


def test_a_broken_profile_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a sac_profile"):
        sac_plan.parse_profile({"ops": [{"op": "aten.mm", "flops": 1, "out": [3]}], "storages": [],
                                "saved": [], "container": "", "block_type": "B", "blocks": 1, "last_pack": 0})


@pytest.mark.slow
def test_whatif_selective_checkpointing_on_tiny_gpt(tmp_path: Path) -> None:
    """The whatif trial applies the plan to the unchanged script; the predicted peak is within
    5% of the measured one and below the baseline; the plan is printed as code."""
    proc = subprocess.run([sys.executable, "-m", "memscope", "whatif", "--try", "selective_checkpointing",
                           "--steps", "2", "--db-dir", str(tmp_path), "--json",
                           str(ROOT / "examples" / "tiny_gpt.py"), "--steps", "4"],
                          capture_output=True, text=True, timeout=240, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    sel = doc["selective_checkpointing"]
    assert sel["plan"]["technique"] == "selective_checkpointing"
    assert sel["plan"]["blocks"] == ["blocks.0", "blocks.1"]
    # the least kept for at most half of whole-block's recompute: the addmm outputs (tiny_gpt's
    # curve: keep addmm+bmm 0%, keep addmm 14%, keep bmm 57%, whole-block 71%)
    assert sel["plan"]["save"] == ["aten.addmm"] and sel["plan"]["recompute_flops_pct"] == pytest.approx(14.29)
    measured, predicted = sel["measured_peak_bytes"], sel["predicted_peak_bytes"]
    assert measured < sel["baseline_peak_bytes"]
    assert predicted == pytest.approx(measured, rel=0.05)
    trial = next(c for c in doc["trials"] if c["technique"] == "selective_checkpointing")
    assert trial["applied"] is True and trial["how"][0]["save"] == ["aten.addmm"]
    # the baseline's report suggests that plan, its saving the predicted peak saving, which the
    # trial's measured saving meets within whatif's tolerance
    with RunReader(str(tmp_path / "whatif-tiny_gpt-baseline.db")) as reader:
        found = [x for x in suggest(reader) if x.technique == "selective_checkpointing"]
    assert len(found) == 1 and "aten.addmm" in found[0].how and "aten.bmm" not in found[0].how
    assert found[0].estimated_saving_bytes == sel["baseline_peak_bytes"] - predicted
    assert trial["estimated_saving_bytes"] == found[0].estimated_saving_bytes and trial["within_tolerance"]


def test_the_plan_is_printed_as_code_that_runs() -> None:
    """whatif's text: the curve, the plan tried, and its code, which Python executes: the
    policy_fn it defines keeps the planned ops and recomputes the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    from memscope.cli.whatif_selective import SelectiveTrial
    from memscope.report.sac_code import policy_code

    p = _profile([("aten.mm", 100, [0]), ("aten.gelu", 0, [1]), ("aten.bmm", 10, [2])], [40, 40, 200], [0, 1, 2])
    trial = SelectiveTrial(p, 5000, 6000, sac_plan.selective_default(p), sac_plan.curve(p), measured_peak=5100)
    text = trial.render()
    assert "no checkpointing" in text and "whole-block" in text and "measured 4.98 KiB" in text
    assert "keep aten.mm            160 B             40 FLOP (9%)" in text
    code = policy_code(trial.save, "", "B").replace("for i, block in enumerate(model):", "for i, block in []:")
    scope: dict[str, Any] = {}
    exec(compile(code, "<plan>", "exec"), scope)
    policy = scope["policy_fn"]
    assert policy(None, torch.ops.aten.mm.default) == CheckpointPolicy.MUST_SAVE
    assert policy(None, torch.ops.aten.bmm.default) == CheckpointPolicy.MUST_SAVE
    assert policy(None, torch.ops.aten.gelu.default) == CheckpointPolicy.PREFER_RECOMPUTE

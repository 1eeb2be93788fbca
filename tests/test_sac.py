"""Selective checkpointing (issue #25): the op-level block profile, the plan curve, the recompute
FLOPs it predicts against FlopCounterMode's count of a real checkpointed backward, the peak
model on small hand-made profiles, and the plan printed as code. Measured runs (predicted peak
against the measured one, whatif end to end): tests/test_sac_curve.py."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

from memscope.agent.whatif.sac_apply import policy_for
from memscope.agent.whatif.sac_profile import BlockProfile, flop_mapping
from memscope.analysis import sac_plan

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
    # whole-block: each block but the last keeps the output it saved itself (the softmax's), as
    # the next block's checkpoint holds it as its input
    assert pts[-1].activation_bytes == 200 * 3 and pts[-1].recompute_flops == 110 * 4
    keep_mm = next(pt for pt in pts if pt.save == ("aten.mm",))
    assert keep_mm.activation_bytes == 40 * 4 + 200 * 3 and keep_mm.recompute_flops == 40
    assert pts[1].save == ("aten.bmm", "aten.mm") and pts[1].recompute_flops == 0  # dominates no ckpt
    for a, b in zip(pts[1:], pts[2:]):  # less memory costs more recompute along the front
        assert b.activation_bytes < a.activation_bytes and b.recompute_flops > a.recompute_flops
    # keeping the bmm (big output, few FLOPs) is dominated by whole-block on the first j blocks
    assert all(pt.save != ("aten.bmm",) for pt in pts)
    assert sac_plan.best_under(p, 800).save == ("aten.mm",)  # type: ignore[union-attr]
    assert sac_plan.suggested(p).save == ("aten.mm",)  # least kept at <= half whole-block's FLOPs


def _block(saved: list[int], died: list[int | None], calls: list[Any]) -> Any:
    """mm -> [0]; exp -> [3], a temporary gelu reads; gelu -> [1]; mul -> [2], the block's
    output; 3 blocks. Backward stops after gelu (the last pack)."""
    return sac_plan.parse_profile({
        "container": "h", "block_type": "B", "blocks": 3, "last_pack": 3,
        "ops": [{"op": "aten.mm", "flops": 100, "out": [0]}, {"op": "aten.exp", "flops": 0, "out": [3]},
                {"op": "aten.gelu", "flops": 0, "out": [1]}, {"op": "aten.mul", "flops": 0, "out": [2]}],
        "storages": [{"bytes": b, "made": True, "died": d} for b, d in zip([100, 300, 50, 1000], died)],
        "saved": saved, "calls": calls})


def test_what_a_rerun_and_a_checkpointed_forward_add() -> None:
    p = _block([0, 1], [None, None, None, 2], [])
    # the rerun stops at the last pack: mm 100, + exp's 1000, then exp's dies as gelu's 300 comes
    assert p.rerun_bytes(frozenset()) == 1100
    assert p.rerun_bytes(frozenset({"aten.mm"})) == 1000  # the kept output is live already
    assert p.checkpointed_forward_bytes(frozenset()) == 1100  # then 400, then 450 with the output
    # a saved tensor made inside a submodule call that does not return it dies at its return
    saved_temp = _block([0, 1, 3], [None, None, None, None], [[1, 3, [1]]])
    assert saved_temp.checkpointed_forward_bytes(frozenset()) == 1400  # 100 + 1000 + 300, then 450
    # without that call it lives to the block's end (a local of the block's own forward may)
    assert _block([0, 1, 3], [None] * 4, []).checkpointed_forward_bytes(frozenset()) == 1450
    # a kept output the forward let go (read once, not saved) is let go in the rerun too
    freed = sac_plan.parse_profile({
        "container": "h", "block_type": "B", "blocks": 1, "last_pack": 3, "saved": [1, 2],
        "ops": [{"op": "aten.mm", "flops": 100, "out": [0]}, {"op": "aten.gelu", "flops": 0, "out": [1]},
                {"op": "aten.mul", "flops": 0, "out": [2]}],
        "storages": [{"bytes": b, "made": True, "died": d} for b, d in [(500, 1), (300, None), (400, None)]]})
    assert freed.rerun_bytes(frozenset({"aten.mm"})) == 300 - 500 + 400
    assert freed.rerun_bytes(frozenset()) == 300 + 400  # mm 500, then gelu 300 as it dies, mul 400
    # a profile recorded before deaths were: nothing known
    old = sac_plan.parse_profile(_raw())
    assert old.rerun_bytes(frozenset()) is None and old.checkpointed_forward_bytes(frozenset()) is None


def _raw() -> dict[str, Any]:
    return {"container": "h", "block_type": "B", "blocks": 3, "last_pack": 1, "saved": [0],
            "ops": [{"op": "aten.mm", "flops": 100, "out": [0]}], "storages": [{"bytes": 100, "made": True}]}


def test_predicted_peak_takes_the_highest_moment() -> None:
    p = _block([0, 1], [None, None, None, 2], [])  # saved 400 per block; rerun 1100
    whole = sac_plan.point(p, frozenset())  # drop 400 a block
    keep = sac_plan.point(p, frozenset({"aten.mm"}), 1)  # first block only, drop 300
    live = sac_plan.Backward(5000, ((2000, 2600), (3000, 3600), (4000, 4800)), (1000, 1500, 2000))
    # the last block's backward window, less the two earlier blocks' drop
    assert sac_plan.predicted_peak(5000, live, p, whole) == 4800 - 2 * 400
    # the forward's peak less one block's drop
    assert sac_plan.predicted_peak(5000, live, p, keep) == 5000 - 300
    # small windows: a rerun (live at the backward's start - drops of blocks 0..k + 1100) is highest
    low = sac_plan.Backward(3000, ((2000, 2050), (2500, 2550), (2900, 2950)), (500, 900, 1300))
    assert sac_plan.predicted_peak(3000, low, p, whole) == max(2500 - 2 * 400, 2900 - 3 * 400) + 1100
    # a baseline peak outside the forward and the windows (an optimizer step) stays
    assert sac_plan.predicted_peak(6000, low, p, whole) == 6000
    assert sac_plan.predicted_peak(6000, low, p, sac_plan.point(p, None)) == 6000
    # an event of the last block only stands for the others with their saved bytes freed
    back = sac_plan.parse_backward({"live_bytes": 4000, "window_peak": 4800}, p)
    assert back == sac_plan.Backward(None, ((3200, 4000), (3600, 4400), (4000, 4800)))
    with pytest.raises(ValueError, match="not a sac_live"):
        sac_plan.parse_backward({"blocks": [[1, 2]], "forward_peak": 3}, p)


def test_a_broken_profile_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a sac_profile"):
        sac_plan.parse_profile({"ops": [{"op": "aten.mm", "flops": 1, "out": [3]}], "storages": [],
                                "saved": [], "container": "", "block_type": "B", "blocks": 1, "last_pack": 0})


def test_the_plan_is_printed_as_code_that_runs() -> None:
    """whatif's text: the curve, the plan tried, and its code, which Python executes: the
    policy_fn it defines keeps the planned ops and recomputes the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    from memscope.cli.whatif_selective import SelectiveTrial
    from memscope.report.sac_code import policy_code

    p = _profile([("aten.mm", 100, [0]), ("aten.gelu", 0, [1]), ("aten.bmm", 10, [2])], [40, 40, 200], [0, 1, 2])
    backward = sac_plan.Backward(None, ((5000, 5000),) * 4)
    trial = SelectiveTrial(p, backward, 6000, sac_plan.selective_default(p), sac_plan.curve(p), measured_peak=5100)
    text = trial.render()
    assert "no checkpointing" in text and "whole-block" in text and "measured 4.98 KiB" in text
    assert "keep aten.mm            760 B             40 FLOP (9%)" in text  # + the outputs carried
    code = policy_code(trial.save, "", "B").replace("for i, block in enumerate(model):", "for i, block in []:")
    scope: dict[str, Any] = {}
    exec(compile(code, "<plan>", "exec"), scope)
    policy = scope["policy_fn"]
    assert policy(None, torch.ops.aten.mm.default) == CheckpointPolicy.MUST_SAVE
    assert policy(None, torch.ops.aten.bmm.default) == CheckpointPolicy.MUST_SAVE
    assert policy(None, torch.ops.aten.gelu.default) == CheckpointPolicy.PREFER_RECOMPUTE


def test_a_modelled_timeline_holds_each_blocks_inputs_gradients_and_transients() -> None:
    """Where a run did not measure its blocks' backward (a plain run), the timeline is modelled:
    block k's backward begins with what is beside the blocks, what blocks 0..k saved and their
    inputs, and the gradient of its output, less the gradients not made yet (its own and the
    blocks' before it, up to those freed before the peak); it adds its transients and its own
    gradients. Its forward begins without those gradients and without the model's output."""
    from memscope.analysis.checkpoint_peak import Region, modelled_backward, peak_after

    blocks = [Region(f"b{k}", saved=400, kept=0, rerun=500, transient=300, held=50, output=50, params=100)
              for k in range(2)]
    tl = modelled_backward(2000, 1000, blocks, unmade=150, after=80)
    assert tl.blocks == ((1000 + 450 + 50 - 100, 1400 + 300 + 100), (1000 + 900 + 50 - 150, 1800 + 300 + 100))
    assert tl.forward_starts == (1000 - 150 - 80 + 50, 1000 - 150 - 80 + 450 + 50) and not tl.measured
    after = peak_after(2000, tl, blocks)
    # block 0's backward: its window, nothing dropped before it; block 1's less block 0's 400;
    # the recomputes (start - what the block drops + its rerun) and the forward's end are lower
    assert (after.bytes, after.at) == (1800, "b0's backward") and after.dropped == 800
    assert sum(b for _, b in after.parts) == after.bytes

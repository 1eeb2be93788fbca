"""The default selective-checkpointing profile of a plain ``attach`` run (issue #25, the
``block_profile`` option, memscope.agent.whatif.sac_once): one forward of the first repeated
block, on a step after warm-up, through hooks on that block instance only. In process: the
right block is profiled, once, with no global hook and no class patch, every hook gone after,
losses bit-identical, nothing kept alive, and the skips (checkpoint, no_grad). Under attach:
``report`` suggests the plan with a saving within 25% of a measured trial of it; compiled and
block-less scripts get no profile and an event saying why."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import importlib.util
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import forget_compiles, memscope, report_json
from shared_runs import shared_attach, shared_loop
from torch.nn.modules import module as nn_module
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from memscope.agent.whatif.sac_once import TRIES, OnceProfile
from memscope.analysis.whatif import measure
from memscope.cli.whatif import run_options
from memscope.runners.script_estimate import run_recorded
from memscope.store.reader import RunReader

ROOT = Path(__file__).resolve().parent.parent
TINY_GPT = ROOT / "examples" / "tiny_gpt.py"


def _tiny_gpt_module() -> Any:
    spec = importlib.util.spec_from_file_location("tiny_gpt_sac_default", TINY_GPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GPT = _tiny_gpt_module()


@pytest.fixture(autouse=True)
def _no_compile_before() -> None:
    """The in-process profiles are not taken once Dynamo compiled in the process: a compile by
    an earlier test file on this xdist worker is forgotten first."""
    forget_compiles()


def _model(checkpoint: bool = False) -> Any:
    torch.manual_seed(0)
    return GPT.TinyGPT(256, 32, 4, 2, 32, checkpoint=checkpoint)


def _memscope_mode_on() -> bool:
    return any(type(m).__module__.startswith("memscope.") for m in _get_current_dispatch_mode_stack())


def _train(model: Any, profile: OnceProfile | None, steps: int = 4, eval_first: bool = False,
           after_step: Any = None) -> list[float]:
    """A real training loop; the boundary after each step calls ``profile.step_closed`` as the
    agent does (the layer profiler's step 1 found the model: from step 1 on it is known)."""
    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        idx = torch.randint(0, 256, (4, 32))
        if eval_first:
            with torch.no_grad():
                model(idx)
        loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if profile is not None:
            profile.step_closed(step, [model] if step >= 1 else [], False, step < 1)
        if after_step is not None:
            after_step(step)
    return losses


def test_one_forward_of_the_first_block_profiled_and_every_hook_gone() -> None:
    """The profile is taken in step 2 (step 0 warms up, step 1 is the layer profiler's) from
    blocks.0 only, while no global module hook exists; then the block's hooks are the user's
    own again, its submodules have none, the class's forward is the one it had; losses are
    bit-identical to a run without it, and a tensor of the profiled forward dies as it does
    without the profile."""
    model = _model()
    first, second = model.blocks[0], model.blocks[1]
    forward = type(first).__dict__["forward"]
    seen: list[tuple[str, bool, bool, bool]] = []  # (block, memscope mode on, grad on, global hooks)
    user = [first.register_forward_pre_hook(lambda m, a: None), first.register_forward_hook(lambda m, a, o: None)]
    outputs: list[Any] = []  # weakrefs to the block's input and its MLP's output, each step
    for name, block in (("blocks.0", first), ("blocks.1", second)):
        block.attn.register_forward_hook(
            lambda m, a, o, name=name: seen.append((name, _memscope_mode_on(), torch.is_grad_enabled(),
                                                    bool(nn_module._global_forward_hooks
                                                         or nn_module._global_forward_pre_hooks))))
    events: list[tuple[str, Any]] = []
    prof = OnceProfile(lambda kind, message, data: events.append((kind, data)))
    first.mlp.register_forward_hook(lambda m, a, o: outputs.append(weakref.ref(o)))
    user.append(first.register_forward_pre_hook(lambda m, a: outputs.append(weakref.ref(a[0]))))
    before = (dict(first._forward_pre_hooks), dict(first._forward_hooks),
              set(first._forward_hooks_always_called), set(first._forward_pre_hooks_with_kwargs))

    def check(step: int) -> None:
        gc.collect()
        assert all(r() is None for r in outputs), step  # the forward's tensors died with the step
        outputs.clear()

    losses = _train(model, prof, eval_first=True, after_step=check)
    assert prof.done and [k for k, _ in events] == ["sac_profile"]
    data = events[0][1]
    assert data["step"] == 2 and data["container"] == "blocks" and data["blocks"] == 2
    assert data["block_type"] == "Block" and len(data["ops"]) > 20 and data["saved"] and data["cpu_s"] > 0
    assert any(o["flops"] for o in data["ops"]) and data["calls"]  # FLOPs counted, submodule calls seen
    profiled = [s for s in seen if s[1]]
    assert profiled == [("blocks.0", True, True, False)]  # once, blocks.0, grad mode, no global hook
    after = (dict(first._forward_pre_hooks), dict(first._forward_hooks),
             set(first._forward_hooks_always_called), set(first._forward_pre_hooks_with_kwargs))
    assert after == before and type(first).__dict__["forward"] is forward
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in first.modules()
               if m is not first and m is not first.attn and m is not first.mlp)
    assert len(first.attn._forward_hooks) == 1 and len(first.mlp._forward_hooks) == 1  # the test's own
    assert losses == _train(_model(), None, eval_first=True)
    for h in user:
        h.remove()


def test_checkpointed_and_evaluation_only_blocks_are_skipped_with_a_reason() -> None:
    """Blocks under torch.utils.checkpoint: the profile's pack hook would replace checkpoint's,
    so it is not taken (one event, at once); blocks that run only under no_grad in the steps
    tried: given up after TRIES steps. Losses unchanged, no hook left."""
    events: list[tuple[str, Any]] = []
    model = _model(checkpoint=True)
    prof = OnceProfile(lambda kind, message, data: events.append((kind, data)))
    assert _train(model, prof) == _train(_model(checkpoint=True), None)
    assert prof.done and [(k, d["reason"]) for k, d in events] == [("sac_profile_skipped", "saved_hooks")]
    assert "checkpoint" in events[0][1]["why"]
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())

    events.clear()
    model = _model()
    prof = OnceProfile(lambda kind, message, data: events.append((kind, data)))
    with torch.no_grad():
        for step in range(TRIES + 3):
            model(torch.randint(0, 256, (2, 32)))
            prof.step_closed(step, [model], False, False)
    assert [(k, d["reason"]) for k, d in events] == [("sac_profile_skipped", "no_grad")]
    assert prof.tries == TRIES and not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


class _Counting(TorchDispatchMode):
    """A script's own dispatch mode: counts the ops it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


class _Reentrant(GPT.TinyGPT):  # type: ignore[misc]
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:  # first forward under no_grad, recomputed inside backward
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)
        return self.head(self.ln_f(x))


def test_a_scripts_dispatch_mode_and_reentrant_checkpointing_are_left_alone() -> None:
    """Under the script's own dispatch mode the profile is not taken (its mode would see the
    profile's, and the profile's it): the mode counts the same ops as without memscope. With
    reentrant checkpointing the block runs under no_grad, then inside backward: given up at
    once with that reason. Losses unchanged both ways."""
    runs = []
    for profiled in (True, False):
        events: list[tuple[str, Any]] = []
        prof = OnceProfile(lambda kind, message, data, events=events: events.append((kind, data))) if profiled else None
        with _Counting() as mode:
            losses = _train(_model(), prof)
        runs.append((losses, mode.ops, events))
    assert runs[0][:2] == runs[1][:2] and runs[0][1] > 0
    assert [(k, d["reason"]) for k, d in runs[0][2]] == [("sac_profile_skipped", "dispatch_mode")]
    assert "_Counting" in runs[0][2][0][1]["why"]

    events = []
    torch.manual_seed(0)
    model = _Reentrant(256, 32, 4, 2, 32)
    prof = OnceProfile(lambda kind, message, data: events.append((kind, data)))
    losses = _train(model, prof)
    torch.manual_seed(0)
    assert losses == _train(_Reentrant(256, 32, 4, 2, 32), None)
    assert [(k, d["reason"]) for k, d in events] == [("sac_profile_skipped", "backward")]
    assert prof.tries == 1 and not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def _events(db: Path | str, kind: str) -> list[dict[str, Any]]:
    with RunReader(str(db)) as reader:
        return [e["data"] for e in reader.events(kind)]


def _tensor_peak(db: str) -> int:
    with RunReader(db) as reader:
        peak = measure(reader).tensor_peak
    assert peak is not None, db
    return peak


@pytest.mark.timeout(300)
def test_plain_attach_suggests_selective_checkpointing_within_25_percent(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """``memscope attach`` of tiny_gpt with the defaults: the profile is taken in step 2, and
    ``report`` (JSON and text) suggests selective_checkpointing. Its estimated saving is within
    25% of the saving measured when the suggested plan is applied for real (whatif's trial:
    exact live tensor bytes of step 1, with and without the plan). The plain run is made once per
    session (tests/shared_runs.py): docs/contracts.md's samples read it too."""
    trial_options = {**run_options(2), "try_techniques": ["selective_checkpointing"], "sac_save": ["aten.addmm"]}
    with ThreadPoolExecutor(3) as pool:  # the plain run, and whatif's baseline and trial of the plan
        plain = pool.submit(shared_attach, tmp_path_factory, [], ["examples/tiny_gpt.py", "--steps", "4"],
                            timeout=240)
        runs = [pool.submit(run_recorded, str(TINY_GPT), ["--steps", "4"], str(tmp_path / f"{name}.db"), options)
                for name, options in (("base", run_options(2)), ("trial", trial_options))]
        (db, out), (base, trial) = plain.result(), [r.result() for r in runs]
    assert out.returncode == 0, out.stderr
    profiles = _events(db, "sac_profile")
    assert len(profiles) == 1 and profiles[0]["step"] == 2 and _events(db, "sac_profile_skipped") == []
    found = [s for s in report_json(db)["suggestions"] if s["technique"] == "selective_checkpointing"]
    assert len(found) == 1, report_json(db)["suggestions"]
    estimate = found[0]["estimated_saving_bytes"]
    assert "aten.addmm" in found[0]["how"] and estimate > 0  # the plan the trial applied
    text = memscope("report", str(db))
    assert text.returncode == 0 and "selective_checkpointing: saves about" in text.stdout

    assert base.ok and trial.ok, (base.log, trial.log)
    assert _events(base.db, "sac_profile") == []  # whatif's runs are left alone (layers every step)
    measured = _tensor_peak(base.db) - _tensor_peak(trial.db)
    assert measured > 0
    print(f"estimate {estimate} measured {measured} ({estimate / measured - 1:+.1%})")
    assert estimate == pytest.approx(measured, rel=0.25), (estimate, measured)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script, reason", [
    (ROOT / "tests" / "scripts" / "sac_limits.py", "compiled"),  # with --compile (aot_eager)
    (ROOT / "tests" / "scripts" / "loop.py", "no_blocks"),  # a Sequential of Linear layers
], ids=["compiled", "no-blocks"])
def test_no_profile_and_an_event_saying_why(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                            script: Path, reason: str) -> None:
    if reason == "compiled":
        db = tmp_path / "run.db"
        out = memscope("attach", "--headless", "--db", str(db), str(script), "--steps", "5", "--compile",
                       timeout=240)
    else:  # the session's 6-step loop.py run at default options, read only (tests/shared_runs.py)
        db, out = shared_loop(tmp_path_factory)
        assert script.name == "loop.py"
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    skipped = _events(db, "sac_profile_skipped")
    assert [s["reason"] for s in skipped] == [reason] and _events(db, "sac_profile") == []
    assert not any(s["technique"] == "selective_checkpointing" for s in report_json(db)["suggestions"])


LATE_COMPILE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from sac_limits import Net
torch.manual_seed(0)
model = Net(64, 3, False)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
run = model
for step in range(5):
    if step == 2:  # compiled in the step the profile is armed for: its hooks must stay unseen
        run = torch.compile(model, backend="aot_eager", fullgraph=True)
    loss = run(torch.randn(32, 16, 64)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    print(f"step {step} loss {loss.item()!r}", flush=True)
"""


@pytest.mark.timeout(300)
def test_a_model_compiled_while_the_profile_is_armed(tmp_path: Path) -> None:
    """The hooks armed for step 2 are out of Dynamo's sight while it compiles (fullgraph=True
    compiles, nothing is printed into the script's output); the profile is not taken and an
    event says why; the losses are bit-identical to the script's own run."""
    script = tmp_path / "late_compile.py"
    script.write_text(LATE_COMPILE)
    db = tmp_path / "run.db"
    args = [str(script), str(ROOT / "tests" / "scripts")]
    with ThreadPoolExecutor(2) as pool:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as conftest.memscope runs attach: same reductions
        plain = pool.submit(subprocess.run, [sys.executable, *args], capture_output=True, text=True, timeout=240,
                            env=env)
        out = pool.submit(memscope, "attach", "--headless", "--db", str(db), *args, timeout=240).result()
        ref = plain.result()
    assert ref.returncode == 0 and out.returncode == 0, (ref.stderr, out.stderr)
    assert out.stdout.splitlines()[:5] == ref.stdout.splitlines() and len(ref.stdout.splitlines()) == 5
    assert [x for x in out.stderr.splitlines() if not x.startswith("memscope: ")] == ref.stderr.splitlines()
    assert [s["reason"] for s in _events(db, "sac_profile_skipped")] == ["compiled"]
    assert _events(db, "sac_profile") == []
    # the one-step tensor peak armed for the same step: set aside while Dynamo compiled, dropped
    assert [e["why"] for e in _events(db, "tensor_peak_skipped")] == ["torch.compile ran during the step"]
    assert _events(db, "tensor_peak") == []


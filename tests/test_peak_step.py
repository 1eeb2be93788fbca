"""The live-tensor peak of one step on a plain run (memscope.agent.collectors.peak_step): measured
on step 2 at the defaults with whatif's counter, the training unchanged; skipped, and said so,
where a dispatch mode would be in the program's way; on CUDA the allocator's peak stands for it
(memscope.analysis.suggestions.facts)."""

from __future__ import annotations

import gc
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from conftest import ROOT, SCRIPTS, forget_compiles, memscope
from memscope.agent.collectors.peak_step import PeakStep, peak_step
from memscope.agent.runtime.config import AgentOptions
from memscope.analysis.suggestions import suggest
from memscope.analysis.suggestions.facts import gather
from memscope.analysis.summary import summarize
from memscope.runners.script_estimate import run_recorded
from memscope.store.reader import RunReader

SCRIPT = SCRIPTS / "peak_step_train.py"


@pytest.fixture(autouse=True)
def _no_compile_before() -> None:
    """The one-step peak stands aside once Dynamo compiled in the process: a compile by an
    earlier test file on this xdist worker is forgotten first."""
    forget_compiles()


def _events(db: Path, kind: str) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        return [json.loads(d) for (d,) in conn.execute("SELECT data FROM events WHERE kind = ? ORDER BY rowid",
                                                       (kind,))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The script without memscope, under a plain ``attach``, and with the every-step counter."""
    d = tmp_path_factory.mktemp("peak-step")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    plain = subprocess.run([sys.executable, str(SCRIPT), "5"], capture_output=True, text=True, env=env)
    attached = memscope("attach", "--headless", "--db", str(d / "plain.db"), str(SCRIPT), "5")
    every = run_recorded(str(SCRIPT), ["5"], str(d / "every.db"), {"tensor_peak": True})
    assert plain.returncode == 0 and attached.returncode == 0 and every.ok, (attached.stderr, every.last_error())
    return {"dir": d, "plain": plain.stdout, "attached": attached.stdout}


def test_a_plain_run_measures_step_2_and_trains_the_same(runs: dict[str, Any]) -> None:
    """Losses bit-identical to the script without memscope (dropout, Adam: 5 steps), and exactly
    one peak measured: step 2, with the whatif counter's fields."""
    assert runs["attached"] == runs["plain"] and runs["plain"].count("loss") == 5
    peaks = _events(runs["dir"] / "plain.db", "tensor_peak")
    assert [(p["step"], p["one_step"]) for p in peaks] == [(2, True)], peaks
    assert peaks[0]["peak_bytes"] > peaks[0]["start_bytes"] > 0
    assert _events(runs["dir"] / "plain.db", "tensor_peak_skipped") == []


def test_the_one_step_peak_is_the_every_step_counters(runs: dict[str, Any]) -> None:
    """The same counter on the same step of the same (seeded) script: the same bytes as the
    ``tensor_peak`` option measures, gradients at the peak included (the script frees them
    before its forward: none live)."""
    one = _events(runs["dir"] / "plain.db", "tensor_peak")[0]
    every = {p["step"]: p for p in _events(runs["dir"] / "every.db", "tensor_peak")}
    assert sorted(every) == [1, 2, 3, 4]
    assert (one["peak_bytes"], one["start_bytes"], one["start_grad_bytes_at_peak"]) == \
        (every[2]["peak_bytes"], every[2]["start_bytes"], every[2]["start_grad_bytes_at_peak"]) == \
        (every[2]["peak_bytes"], every[2]["start_bytes"], 0)
    # and the phase it peaked in: the loss's backward, its gradient beside the logits and their
    # log-softmax
    assert one["phase"] == every[2]["phase"] == "backward", (one, every[2])


def test_the_plain_report_counts_the_working_set(runs: dict[str, Any]) -> None:
    """The float32 logits and their log-softmax beside the activations: the plain report's
    gradient_accumulation figure is half of the peak less the model states (it was half the
    activations alone)."""
    with RunReader(str(runs["dir"] / "plain.db")) as reader:
        f = gather(reader, summarize(reader))
        acc = {s.technique: s for s in suggest(reader)}["gradient_accumulation"]
    assert f is not None and f.tensor_peak == _events(runs["dir"] / "plain.db", "tensor_peak")[0]["peak_bytes"]
    states = f.parameters + f.optimizer_state  # the gradients were freed before the peak
    scaled = f.tensor_peak - states
    assert scaled > 1.2 * f.activations  # a working set worth counting
    assert acc.estimated_saving_bytes == scaled - scaled // 2 - f.gradients
    assert "working tensors beside them" in acc.evidence


# -- in process: the collector itself, real torch ops --------------------------------------------


class Host:
    """What PeakStep asks of the agent: its options, whether it runs, an event sink."""

    def __init__(self, **options: Any) -> None:
        self.options = AgentOptions(**options)
        self.running = True
        self.events: list[tuple[str, str, Any]] = []

    def event(self, kind: str, message: str, data: Any = None) -> None:
        self.events.append((kind, message, data))


def _train_step(model: nn.Module, opt: torch.optim.Optimizer) -> "weakref.ref[torch.Tensor]":
    x = torch.randn(16, 32)
    out = model(x)
    out.square().mean().backward()
    opt.step()
    opt.zero_grad()
    return weakref.ref(out)


def _collector(**options: Any) -> tuple[Host, PeakStep]:
    host = Host(**options)
    return host, PeakStep(host, on_cuda=lambda: False)  # type: ignore[arg-type]


def test_the_measured_step_keeps_nothing_alive_and_leaves_no_mode() -> None:
    model, host_peak = nn.Linear(32, 32), _collector()
    host, peak = host_peak
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    peak.step_opening(2)
    assert type(_get_current_dispatch_mode()).__name__ == "_Mode"  # counting
    out = _train_step(model, opt)
    gc.collect()
    assert out() is None  # the step's output died with the step, counted or not
    peak.step_closed(2)
    assert _get_current_dispatch_mode() is None and peak.peak is None
    (kind, _, data), = host.events
    assert kind == "tensor_peak" and data["step"] == 2 and data["peak_bytes"] >= 16 * 32 * 4


def test_which_step_is_measured() -> None:
    assert peak_step(AgentOptions()) == 2
    assert peak_step(AgentOptions(layers_first=2)) == 3  # the layer profile's step is not slowed
    assert peak_step(AgentOptions(layers_every=0)) is None  # no breakdown to read it beside
    assert peak_step(AgentOptions(tensor_peak=True)) is None  # whatif measures every step
    assert peak_step(AgentOptions(max_steps=2)) is None  # the run ends before it


class UserMode(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_a_programs_dispatch_mode_is_left_alone() -> None:
    """Active at the step's start: the step is not measured, and an event says why. Entered
    during the step and held past its end: ours stays under it (inactive) until it leaves."""
    host, peak = _collector()
    with UserMode() as mode:
        peak.step_opening(2)
        assert _get_current_dispatch_mode() is mode
        torch.ones(3) + 1
        assert mode.ops == 2
    assert [(k, d) for k, _, d in host.events] == \
        [("tensor_peak_skipped", {"step": 2, "why": "the program's UserMode (a TorchDispatchMode) is active"})]

    host, peak = _collector()
    peak.step_opening(2)
    mode = UserMode()
    mode.__enter__()
    try:
        peak.step_closed(2)  # the program's mode on top: not popped
        assert _get_current_dispatch_mode() is mode
        assert [k for k, _, _ in host.events] == ["tensor_peak", "warning"]
    finally:
        mode.__exit__(None, None, None)
    assert type(_get_current_dispatch_mode()).__name__ == "_Mode"
    peak.step_closed(3)  # the next boundary takes ours off
    assert _get_current_dispatch_mode() is None


def test_not_measured_under_torch_compile_nor_on_cuda() -> None:
    host, peak = _collector()
    peak.on_cuda = lambda: True
    peak.step_opening(2)
    assert peak.peak is None and host.events == []  # the allocator's peak is in the steps table

    compiled = torch.compile(lambda t: t * 2, backend="eager")
    try:
        compiled(torch.ones(2))
        host, peak = _collector()
        peak.step_opening(2)
        assert peak.peak is None and _get_current_dispatch_mode() is None
        (kind, _, data), = host.events
        assert kind == "tensor_peak_skipped" and "torch.compile" in data["why"]
    finally:  # this process's later tests (the worker's next files) see no compile
        del compiled
        forget_compiles()


def test_on_cuda_the_allocator_peak_less_the_workspaces(tmp_path: Path) -> None:
    """A real H100 run of nanoGPT: its allocator peak (step 1) less what was allocated at the
    step's start beyond the model states (cuBLAS workspaces: 68 MiB) is the live-tensor peak the
    suggestions read. Here the gradients (freed before the forward) are counted as live: no
    working set beside the activations, the figures as before (activations / 2)."""
    db = shutil.copy(ROOT / "tests" / "data" / "cuda_run_nanogpt_real.db", tmp_path / "run.db")
    with RunReader(str(db)) as reader:
        f = gather(reader, summarize(reader))
        acc = {s.technique: s for s in suggest(reader)}["gradient_accumulation"]
    states = 43083264 * 2 + 86166832  # parameters, gradients, AdamW's state (step_breakdown)
    workspaces = 243849728 - states  # step 0's end_allocated beyond them
    assert f is not None and f.tensor_peak == 376887296 - workspaces
    assert acc.estimated_saving_bytes == f.activations - f.activations // 2


NO_COMPILE = '''
import sys
import torch
blocks = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(3)])
for step in range(5):
    loss = blocks(torch.randn(32, 64)).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        for p in blocks.parameters():
            p -= 0.01 * p.grad
            p.grad = None
print("dynamo imported:", "torch._dynamo" in sys.modules)
'''


def test_the_measured_step_and_the_block_profile_leave_dynamo_unimported(tmp_path: Path) -> None:
    """A script that never compiles does not import torch._dynamo; under a plain attach, whose
    step 2 runs the peak counter's dispatch mode and the block profile's, it still does not
    (torch wraps a mode's __torch_dispatch__ in _disable_dynamo unless the mode opts out: an
    import of a second or more of CPU into every run)."""
    script = tmp_path / "no_compile.py"
    script.write_text(NO_COMPILE)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    attached = memscope("attach", "--headless", "--db", str(tmp_path / "run.db"), str(script))
    assert plain.returncode == 0 and attached.returncode == 0, attached.stderr
    assert plain.stdout == attached.stdout == "dynamo imported: False\n", (plain.stdout, attached.stdout)
    assert [p["step"] for p in _events(tmp_path / "run.db", "tensor_peak")] == [2]
    assert [p["step"] for p in _events(tmp_path / "run.db", "sac_profile")] == [2]

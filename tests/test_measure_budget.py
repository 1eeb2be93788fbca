"""A measured step priced as it goes (memscope.agent.collectors.measure_budget): on an op-heavy
few-step LBFGS training at DEFAULT options the layer profile and the live-tensor peak stop after
the first closure evaluation that spent their share, record what they measured exactly (the
same rows as a profile of every evaluation), count every evaluation still, and say so in the
report; and the decision itself, fed the CPU times measured on that training."""

from __future__ import annotations

import importlib.util
import json
import re
import sqlite3
from pathlib import Path
from types import ModuleType

import pytest
import torch

from conftest import SCRIPTS, cli, memscope, report_json
from memscope.agent.collectors.layers import LayerProfiler
from memscope.agent.collectors.measure_budget import ALLOWANCE_S, SHARE, Measure

# tests/scripts/lstm_lbfgs.py at a size where one closure evaluation is about 0.07 s of CPU
# plain and 0.25 s under the layer hooks (2-core machine): 3 steps of 5 evaluations
ARGS = ("--steps", "3", "--samples", "20", "--length", "100", "--future", "100", "--max-iter", "5")


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lstm_lbfgs", SCRIPTS / "lstm_lbfgs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def lbfgs_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    db = tmp_path_factory.mktemp("lbfgs") / "run.db"
    out = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "lstm_lbfgs.py"), *ARGS, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # the script counts its own closure evaluations per step (LBFGS stops early on convergence)
    evaluations = [int(n) for n in re.findall(r"^step \d+ evaluations (\d+)", out.stdout, re.M)]
    assert len(evaluations) == 3, out.stdout
    return db, evaluations


def test_lbfgs_steps_are_measured_in_part_and_said(lbfgs_run: tuple[Path, list[int]]) -> None:
    db, evaluations = lbfgs_run
    report = report_json(db)
    assert report["run"]["steps"] == 3
    # memscope's step n ends where the script's optimizer.step() of its step n returns
    n1, n2 = evaluations[1], evaluations[2]
    layers_line, peak_line = report["run"]["measured"]
    # cut once they cost their share: after the first evaluation here, the second on a slower or
    # busier CPU (the budget is CPU time, each evaluation about 0.25 s measured)
    k1 = re.match(rf"step 1: layers were profiled over its first (\d+) of {n1} closure evaluations", layers_line)
    k2 = re.match(rf"step 2: the live tensor peak was measured over its first (\d+) of {n2} closure "
                  "evaluations", peak_line)
    assert k1 and k2, (layers_line, peak_line)
    assert 1 <= int(k1.group(1)) <= 2 < n1 and 1 <= int(k2.group(1)) <= 2 < n2, (layers_line, peak_line)
    text = cli("report", str(db)).stdout
    assert f"measured  {layers_line}" in text and f"measured  {peak_line}" in text
    # every evaluation counted, the unprofiled ones too
    assert report["hotspots_step"] == 1
    assert report["hotspots_micro_batches"] == report["hotspots_closure_forwards"] == n1
    with sqlite3.connect(db) as conn:
        (data,) = conn.execute("SELECT data FROM events WHERE kind = 'tensor_peak'").fetchone()
    peak = json.loads(data)
    assert peak["step"] == 2 and peak["closure_evaluations_measured"] == int(k2.group(1))
    assert peak["closure_evaluations"] == n2
    bd = report["peak"]["breakdown"]
    # the peak of a forward and its backward: the model and one forward's saved activations live
    assert peak["peak_bytes"] >= bd["parameters"] + bd["activations"]


def test_lbfgs_rows_of_one_evaluation_are_those_of_all(lbfgs_run: tuple[Path, list[int]]) -> None:
    """The rows of the step profiled over its first evaluation are, module by module, those of
    the same step profiled over every evaluation (here, in this process, without a budget)."""
    db, _ = lbfgs_run
    with sqlite3.connect(db) as conn:
        got = {m: (b, n, c) for m, b, n, c in conn.execute(
            "SELECT module, saved_bytes, saved_tensors, calls FROM layer_stats WHERE step = 1 AND module != ''")}
    m = _script()
    torch.manual_seed(0)
    data = m.sine_waves(20, 100)
    inp, target = data[3:, :-1], data[3:, 1:]
    seq = m.Sequence().double()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=5)
    criterion = torch.nn.MSELoss()

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = criterion(seq(inp), target)
        loss.backward()
        return loss

    profiler = LayerProfiler()  # the rows depend on the shapes, not on the step's weights
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the run's (OMP_NUM_THREADS=1): small ops, no thread hand-offs
    profiler.begin(1)
    try:
        optimizer.step(closure)
    finally:
        rows = profiler.end()
        torch.set_num_threads(threads)
    full = {r.name: (r.saved_bytes, r.saved_tensors, r.calls) for r in rows if r.name}
    assert got == full and set(got) == {"lstm1", "lstm2", "linear", "MSELoss"}


# CPU seconds measured on tests/scripts/lstm_lbfgs.py (2-core machine): the training thread's CPU
# when step 1 began (torch's import done, the script's setup and step 0: 20 evaluations of 0.07
# s), a first closure evaluation under the layer hooks with step 0's no-grad prediction before it
# (0.228 s); and examples/scenarios/mlp.py --optimizer lbfgs at its defaults: 20 evaluations of
# about 4 ms under the hooks after a step 0 of 0.02 s
LSTM_TRAINED_S, LSTM_FIRST_EVAL_S = 1.65, 0.228
MLP_TRAINED_S, MLP_EVAL_S = 0.02, 0.004


def _evaluations(m: Measure, began: float, each_s: float, count: int, closure: bool = True) -> int:
    """Feed ``count`` evaluations of ``each_s`` to ``m``; the number measured."""
    now = began
    for i in range(1, count + 1):
        now += each_s
        if m.due_cut(closure, now):
            m.cut(now, i, i if closure else 0)
            return i
    return count


def test_decision_on_measured_timings() -> None:
    m = Measure()
    m.start(100.0, LSTM_TRAINED_S)
    assert m.budget_s == pytest.approx(SHARE * LSTM_TRAINED_S + ALLOWANCE_S)
    assert _evaluations(m, 100.0, LSTM_FIRST_EVAL_S, 20) == 1  # cut after the first evaluation
    assert m.cost_at_cut == pytest.approx(LSTM_FIRST_EVAL_S)
    assert m.unmeasured(20, 20) == (19, 19)
    assert not m.due_cut(True, 1e9)  # once
    # a cheap closure step is measured whole (the allowance): nothing changes for it
    m.start(5.0, MLP_TRAINED_S)
    assert _evaluations(m, 5.0, MLP_EVAL_S, 20) == 20 and m.cut_at is None and m.unmeasured(20, 20) == (0, 0)
    # the same evaluations late in a long run: its share grows with the training
    m.start(50.0, 40 * LSTM_FIRST_EVAL_S / 0.05)
    assert _evaluations(m, 50.0, LSTM_FIRST_EVAL_S, 25) == 25
    # micro-batches the script accumulates (backwards outside optimizer.step()) are never cut
    m.start(0.0, LSTM_TRAINED_S)
    assert _evaluations(m, 0.0, LSTM_FIRST_EVAL_S, 8, closure=False) == 8 and m.cut_at is None
    # a measurement never begun is never cut
    assert not Measure().due_cut(True, 1e9)


def test_unprofiled_evaluations_counted(lbfgs_run: tuple[Path, list[int]]) -> None:
    """`memscope layers` says the step's evaluations as the script counted them."""
    db, evaluations = lbfgs_run
    first = cli("layers", str(db)).stdout.splitlines()[0]
    assert f"{evaluations[1]} evaluations of the optimizer's closure" in first

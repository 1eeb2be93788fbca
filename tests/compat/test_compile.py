"""torch.compile under memscope: never fails, splits, recompiles or warns, and says honestly
what it attributes (the compiled region as a whole, named after the module it wraps)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import check, layer_rows, run_three

STEPS = 8


def _same_graphs(arms: dict) -> None:
    plain = arms["plain"].out["dynamo"]
    assert plain["unique_graphs"] >= 1
    for name in ("default", "invasive"):
        assert arms[name].out["dynamo"] == plain, (name, arms[name].out["dynamo"], plain)


@pytest.mark.parametrize("variant", ["fullgraph", "dynamic"])
def test_compiled_model(tmp_path: Path, variant: str) -> None:
    arms = run_three(tmp_path, "compile.py", [variant])
    check(arms, tmp_path, STEPS)
    _same_graphs(arms)
    # under compile the compiled region is one row: the model, saving its activations as a whole
    rows = layer_rows(arms["invasive"].db)
    assert rows[""][0] == "OptimizedModule" and rows[""][2] > 0, rows
    assert not [m for m in rows if m.startswith(("embed", "body", "head"))], rows


def test_compiled_submodule_with_a_graph_break(tmp_path: Path) -> None:
    arms = run_three(tmp_path, "compile.py", ["submodule"])
    check(arms, tmp_path, STEPS)
    _same_graphs(arms)
    assert arms["plain"].out["dynamo"]["graph_breaks"] >= 1
    rows = layer_rows(arms["invasive"].db)
    # eager modules keep their rows; the compiled one is one row named as the model names it
    assert rows["body"][0] == "OptimizedModule" and rows["body"][2] > 0, rows
    assert rows["embed"][0] == "Linear" and rows["head"][0] == "Linear", rows
    assert not [m for m in rows if m.startswith("body.")], rows


@pytest.mark.parametrize("variant", ["function", "inplace"])
def test_compiled_without_a_compiled_module(tmp_path: Path, variant: str) -> None:
    """A compiled function calling the model, and model.compile(): memscope's hooks are hidden
    from Dynamo while it compiles (also the evaluation graph compiled mid-run, during a profiled
    step), so the graphs are plain python's; no module boundary is seen at run time inside."""
    arms = run_three(tmp_path, "compile.py", [variant])
    check(arms, tmp_path, STEPS)
    _same_graphs(arms)
    assert arms["plain"].out["dynamo"]["unique_graphs"] >= 2  # training and evaluation
    rows = layer_rows(arms["invasive"].db)
    assert rows["<no module>"][2] > 0, rows
    assert not [m for m in rows if m.startswith(("embed", "body", "head"))], rows


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_inductor_on_cpu(tmp_path: Path) -> None:
    arms = run_three(tmp_path, "compile.py", ["inductor"], timeout=500)
    check(arms, tmp_path, STEPS)
    _same_graphs(arms)
    rows = layer_rows(arms["invasive"].db)
    assert rows[""][0] == "OptimizedModule", rows

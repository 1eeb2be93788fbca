"""torch.compile under memscope: never fails, splits, recompiles or warns, and says honestly
what it attributes (the compiled region as a whole, named after the module it wraps).

The six variants run one after another in one process per arm (cases/compile.py: Dynamo's code
caches and counters cleared between them), so torch and Dynamo are imported once per arm, not
once per variant; each test reads its variant's steps, graph counts and layer rows from that
one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import check, layer_rows, run_three

STEPS = 8
# function and inplace first: before them no torch.compile(module) exists, so memscope hooks with
# global module hooks, which only its shield hides from Dynamo (as in a script of their own); the
# others each make an OptimizedModule, alive in a script of their own too
VARIANTS = ["function", "inplace", "fullgraph", "dynamic", "submodule", "inductor"]
# the run of all six (Inductor's C++ builds in the plain arm) is paid by the first test to ask
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def arms(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    tmp_path = tmp_path_factory.mktemp("compile")
    return run_three(tmp_path, "compile.py", VARIANTS, timeout=800), tmp_path


def _checked(arms: tuple[dict[str, Any], Path], variant: str) -> dict[str, tuple[str, int, int]]:
    """The checks every compat case makes (on the whole run), this variant's graph counts the
    same under attach as under plain python, and its last step's layer rows (invasive arm)."""
    runs, tmp_path = arms
    check(runs, tmp_path, STEPS * len(VARIANTS))
    plain = runs["plain"].out["dynamo"][variant]
    assert plain["unique_graphs"] >= 1
    for name in ("default", "invasive"):
        assert runs[name].out["dynamo"][variant] == plain, (name, runs[name].out["dynamo"][variant], plain)
    return layer_rows(runs["invasive"].db, step=STEPS * VARIANTS.index(variant) + STEPS - 1)


@pytest.mark.parametrize("variant", ["fullgraph", "dynamic"])
def test_compiled_model(arms: tuple[dict[str, Any], Path], variant: str) -> None:
    rows = _checked(arms, variant)
    # under compile the compiled region is one row: the model, saving its activations as a whole
    assert rows[""][0] == "OptimizedModule" and rows[""][2] > 0, rows
    assert not [m for m in rows if m.startswith(("embed", "body", "head"))], rows


def test_compiled_submodule_with_a_graph_break(arms: tuple[dict[str, Any], Path]) -> None:
    rows = _checked(arms, "submodule")
    assert arms[0]["plain"].out["dynamo"]["submodule"]["graph_breaks"] >= 1
    # eager modules keep their rows; the compiled one is one row named as the model names it
    assert rows["body"][0] == "OptimizedModule" and rows["body"][2] > 0, rows
    assert rows["embed"][0] == "Linear" and rows["head"][0] == "Linear", rows
    assert not [m for m in rows if m.startswith("body.")], rows


@pytest.mark.parametrize("variant", ["function", "inplace"])
def test_compiled_without_a_compiled_module(arms: tuple[dict[str, Any], Path], variant: str) -> None:
    """A compiled function calling the model, and model.compile(): memscope's hooks are hidden
    from Dynamo while it compiles (also the evaluation graph compiled mid-run, during a profiled
    step), so the graphs are plain python's; no module boundary is seen at run time inside."""
    rows = _checked(arms, variant)
    assert arms[0]["plain"].out["dynamo"][variant]["unique_graphs"] >= 2  # training and evaluation
    assert rows["<no module>"][2] > 0, rows
    assert not [m for m in rows if m.startswith(("embed", "body", "head"))], rows


@pytest.mark.slow
def test_inductor_on_cpu(arms: tuple[dict[str, Any], Path]) -> None:
    rows = _checked(arms, "inductor")
    assert rows[""][0] == "OptimizedModule", rows

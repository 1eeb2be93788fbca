"""Eager-mode features a training script may use, each run plain, under attach, and under
attach at its most invasive settings (see harness.py for what is compared).

The cases that step an optimizer run one after another in one process per arm
(cases/several.py: each case's objects collected before the next starts), so torch is imported
once per arm, not once per case; each test reads its case's results, output and layer rows from
that one run. functional_call.py (no optimizer: its steps end with each backward, a mode the
agent decides once, at a process's first backward) runs in processes of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import Arm, check, layer_rows, read_rows, run_three

STEPS = 8
# submodule_first first: its step 1 is the one step the default arm profiles (layers_first=1,
# every 50), and the test of its names reads both arms; user_hooks last: its full backward hook
# keeps its model and optimizer alive to the end of the process, and a live optimizer stays the
# one whose steps end memscope's steps
SHARED = ["submodule_first.py", "thread_loop.py", "checkpointing.py", "autocast.py", "channels_last.py",
          "complex_sparse.py", "user_hooks.py"]
ALONE = ["functional_call.py"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Arm], Path]:
    tmp_path = tmp_path_factory.mktemp("eager")
    return run_three(tmp_path, "several.py", SHARED), tmp_path


@pytest.mark.parametrize("script", [s for s in SHARED if s != "submodule_first.py"] + ALONE)
def test_eager_feature(shared: tuple[dict[str, Arm], Path], tmp_path: Path, script: str) -> None:
    if script in ALONE:
        arms = run_three(tmp_path, script)
        check(arms, tmp_path, STEPS)
        rows = layer_rows(arms["invasive"].db)
        out = {name: arm.out for name, arm in arms.items()}
    else:
        arms, where = shared
        check(arms, where, STEPS * len(SHARED))
        assert set(arms["plain"].out) == set(SHARED)
        # this case's last step, profiled in the invasive arm
        rows = layer_rows(arms["invasive"].db, step=STEPS * SHARED.index(script) + STEPS - 1)
        out = {name: arm.out[script] for name, arm in arms.items()}
    assert rows, "no module was profiled"
    if script == "user_hooks.py":  # the script's own hooks ran as often under memscope
        for name, results in out.items():
            seen = results["seen"]
            assert seen["pre"] == seen["post"] == STEPS and seen["backward"] == STEPS, (name, seen)
            assert seen["packed"] > 0 and seen["unpacked"] > 0, (name, seen)
    if script == "checkpointing.py":
        # checkpointed blocks keep their names and each shows what checkpointing keeps (its
        # input: 16 x 32 float32), reentrant (block_a) or not (block_b, the first segment of
        # checkpoint_sequential); what they recompute in backward is not a row or a call
        assert {"block_a", "block_b", "tail.0", "stem", "head"} <= set(rows), sorted(rows)
        for name in ("block_a", "block_b", "tail.0"):
            assert rows[name][1:] == (1, 16 * 32 * 4), (name, rows[name])
        assert rows[""][2] == 0  # the caller keeps nothing of its own
        assert not [m for m in rows if m.startswith("<") and m != "<no module>"], sorted(rows)
        assert all(calls == 1 for m, (_, calls, _) in rows.items() if m != "<no module>"), rows


def test_names_are_the_outer_models_when_a_submodule_is_called_first(
        shared: tuple[dict[str, Arm], Path]) -> None:
    """An edge of the agent's contract (cases/submodule_first.py): a model held by another
    module, its first layer called on its own before the whole model, and a loss module."""
    arms, where = shared
    check(arms, where, STEPS * len(SHARED))
    first = STEPS * SHARED.index("submodule_first.py")
    for name in ("default", "invasive"):
        assert arms[name].db is not None
        profiled = read_rows(arms[name].db, "SELECT MAX(step) FROM layer_stats WHERE step < ?",
                             (first + STEPS,))[0][0]
        assert profiled is not None and profiled >= first, (name, profiled)  # a step of this case
        rows = layer_rows(arms[name].db, step=profiled)
        assert {"net", "net.0", "net.1", "net.2", "CrossEntropyLoss"} <= set(rows), sorted(rows)
        assert rows["net.0"][1] == 2  # on its own, then inside the model
        assert not [m for m in rows if m[:1].isdigit() or ":" in m], sorted(rows)

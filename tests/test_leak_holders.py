"""Who holds a leak: closure cells, defaults, keyword defaults, functools.partial, bound methods,
instance and class attributes, an imported module's globals, a function's local list (not its
alias of the newest element), a LightningModule attribute and a Trainer callback. Real runs at
DEFAULT options, 12 steps."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from conftest import SCRIPTS, memscope, report_json
from shared_runs import shared_attach


@pytest.fixture(scope="module")
def holders_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # made once per session (tests/shared_runs.py): the dashboard's layout test reads it too
    db, out = shared_attach(tmp_path_factory, [], ["tests/scripts/leak_holders.py", "12"])
    assert out.returncode == 0, out.stderr
    return report_json(db)


@pytest.mark.parametrize("width,held_by", [
    (101, "__main__.make_probe.<locals>.probe.<closure seen>"),
    (102, "__main__.log.__defaults__[0]"),
    (103, "__main__.log_kw.__kwdefaults__['store']"),
    (104, "__main__.record.args[0]"),
    (105, "__main__.callbacks[0].__self__.items"),
    (106, "__main__.tracker.history"),
    (107, "leakmod.BUFFER"),
    (108, "__main__.per_param[<Parameter float32 [64, 64]>]"),  # not the tensor's repr
])
def test_holder_named(holders_report: dict[str, Any], width: int, held_by: str) -> None:
    (lk,) = [lk for lk in holders_report["leaks"] if lk["shape"] == [4, width]]
    assert lk["held_by"] == held_by
    assert lk["bytes_per_step"] == 4 * width * 4 and lk["tensors_per_step"] == 1.0
    if width == 107:  # leakmod.keep(torch.zeros(...)): kept by BUFFER.append(t) in the module
        assert (lk["site"], lk["created_at"]) == ("tests/scripts/leakmod.py:7", "tests/scripts/leak_holders.py:73")
    else:
        assert lk["site"] is not None and lk["site"].startswith("tests/scripts/leak_holders.py:")
    assert lk["last_step"] == 11


def test_local_container_not_its_alias(holders_report: dict[str, Any]) -> None:
    """``losses.append(loss)`` in a function: the list, not the variable naming its newest
    element; the fix names the list and says loss.item()."""
    (lk,) = [lk for lk in holders_report["leaks"] if lk["shape"] == []]
    assert lk["held_by"] == "__main__.train.<locals>.losses"
    assert lk["category"] == "activations" and lk["kind"] == "tensors"
    assert lk["graph_nodes_per_step"] > 0  # each loss keeps its step's graph nodes
    fix = [s for s in holders_report["suggestions"] if "losses" in s["evidence"]]
    assert fix and "loss.item()" in fix[0]["how"] and "__main__.train.<locals>.losses" in fix[0]["how"]
    assert len(holders_report["leaks"]) == 9


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="needs lightning")
def test_lightning_module_attribute_and_callback(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    out = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "leak_lightning.py"), "12",
                   timeout=300)
    assert out.returncode == 0, out.stderr
    leaks = {tuple(lk["shape"]): lk for lk in report_json(db)["leaks"]}
    assert leaks[(64, 12)]["held_by"] == "<__main__.Lit>.step_outputs"
    assert leaks[(64, 7)]["held_by"] == "__main__.main.<locals>.trainer.callbacks[0].seen"
    assert all(lk["site"] and lk["site"].startswith("tests/scripts/leak_lightning.py:") for lk in leaks.values())

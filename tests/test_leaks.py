"""Leak detection: real runs under ``memscope attach`` with tensor inventories, plus the pure
verdict rule on plain numbers."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLES, ROOT, memscope, report_json
from memscope.analysis.leaks import growth
from memscope.store.schema import SCHEMA_VERSION, migrate

LEAKS = EXAMPLES / "leaks"


def attach(db: Path, script: Path, *args: str, every: int = 2) -> None:
    out = memscope("attach", "--headless", "--db", str(db), "--inventory-every", str(every),
                   str(script), *args)
    assert out.returncode == 0, out.stderr


# -- the verdict rule ------------------------------------------------------------------------------

def pts(steps: list[int], sizes: list[int]) -> list[tuple[int, int, int]]:
    return [(s, b, b // 4) for s, b in zip(steps, sizes)]


def test_growth_rule() -> None:
    steps = [0, 2, 4, 6, 8, 10]
    g = growth(pts(steps, [0, 100, 200, 300, 400, 500]))
    assert g is not None and g.bytes_per_step == 50 and (g.first_step, g.last_step) == (2, 10)
    # warm-up: a jump before step 2 does not count; growth after it does
    assert growth(pts(steps, [0, 1000, 1000, 1000, 1000, 1000])) is None
    assert growth(pts(steps, [0, 0, 0, 0, 0, 1000])) is None  # one-time growth
    assert growth(pts(steps, [0, 100, 200, 300, 300, 300])) is None  # bounded buffer: plateau
    assert growth(pts(steps, [100, 100, 900, 100, 900, 100])) is None  # evaluation spikes
    assert growth(pts([0, 2, 4, 6], [0, 100, 200, 300])) is None  # too few inventories after warm-up
    assert growth(pts(steps, [0, 10, 20, 30, 40, 4000])) is None  # not steady: a late jump
    # a leak still growing at the end after an early plateau is a leak from where it resumed
    g = growth(pts(steps + [12, 14], [0, 50, 50, 100, 200, 300, 400, 500]))
    assert g is not None and g.first_step == 4


# -- leaks found in real runs ------------------------------------------------------------------------

# site: the line that stored the leaked tensor in its container (for a one-line
# ``lst.append(t.detach())`` also the line that created it); module: the module whose forward
# produced the tensor's storage ("" is the model itself), None when no module made it
@pytest.mark.parametrize("script,held_by,site,module,shape,category,per_step", [
    (EXAMPLES / "leaky.py", "__main__.loss_history", "examples/leaky.py:36", None, [],
     "activations", None),
    (LEAKS / "detached_list.py", "__main__.features", "examples/leaks/detached_list.py:24", "1",
     [32, 256], "other", 32 * 256 * 4),
    (LEAKS / "hook_cache.py", "__main__.model.2.cache", "examples/leaks/hook_cache.py:13", "2",
     [32, 256], "other", 32 * 256 * 4),
    (LEAKS / "class_cache.py", "__main__.EmbeddingCache.store", "examples/leaks/class_cache.py:16",
     None, [32, 64], "other", 32 * 64 * 4),
    (LEAKS / "local_list.py", "__main__.train.<locals>.history", "examples/leaks/local_list.py:24",
     "", [32, 10], "other", 32 * 10 * 4),
])
def test_leaks_found_with_holder(tmp_path: Path, script: Path, held_by: str, site: str,
                                 module: str | None, shape: list[int], category: str,
                                 per_step: int | None) -> None:
    db = tmp_path / "run.db"
    args = ["--steps", "24"] + (["--width", "128", "--batch", "32"] if script.name == "leaky.py" else [])
    attach(db, script, *args)
    report = report_json(db)
    leaks = report["leaks"]
    assert len(leaks) == 1, leaks
    lk = leaks[0]
    assert lk["held_by"] == held_by
    assert lk["site"] == site
    assert lk["module"] == module
    assert lk["shape"] == shape and lk["category"] == category and lk["dtype"] == "float32"
    assert lk["tensors_per_step"] == 1.0
    assert lk["last_step"] == 22 and 2 <= lk["first_step"] <= 6
    if per_step is not None:
        assert lk["bytes_per_step"] == per_step
    else:  # a retained graph: the scalar loss and the activations its graph saved
        assert lk["bytes_per_step"] > 32 * 128 * 4
    assert set(lk) == {"bytes_per_step", "tensors_per_step", "shape", "dtype", "category",
                       "held_by", "site", "module", "first_step", "last_step"}
    (sug,) = report["suggestions"]
    assert sug["technique"] == "fix_leak"
    assert sug["estimated_saving_bytes"] == lk["bytes_per_step"] * report["run"]["steps"]
    assert held_by in sug["evidence"]
    assert (".item()" in sug["how"]) == (script.name == "leaky.py")
    assert site in sug["how"]
    if script.name != "leaky.py":
        assert "clear or bound" in sug["how"]


def test_healthy_run_has_no_leak(tmp_path: Path) -> None:
    """Lazy Adam state, an LR scheduler, evaluations and a deque(maxlen=5): nothing leaks, even
    with an inventory at every step."""
    db = tmp_path / "run.db"
    attach(db, LEAKS / "healthy.py", "--steps", "20", every=1)
    report = report_json(db)
    assert report["leaks"] == [] and report["suggestions"] == []
    with sqlite3.connect(db) as conn:
        steps = [r[0] for r in conn.execute("SELECT step FROM inventories ORDER BY step")]
        cats = {r[0] for r in conn.execute("SELECT DISTINCT category FROM inventory_groups")}
        adam = conn.execute("SELECT sum(bytes) FROM inventory_groups WHERE step = 5"
                            " AND category = 'optimizer_state'").fetchone()[0]
        params = conn.execute("SELECT sum(bytes) FROM inventory_groups WHERE step = 5"
                              " AND category = 'parameters'").fetchone()[0]
    assert steps == list(range(20))
    assert {"parameters", "gradients", "optimizer_state", "other"} <= cats
    assert adam >= 2 * params  # exp_avg and exp_avg_sq, created lazily at step 0
    out = memscope("leaks", str(db))
    assert out.returncode == 0 and "leaks: none" in out.stdout


def test_leaks_cli_diff_and_errors(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    attach(db, LEAKS / "detached_list.py", "--steps", "12")
    out = memscope("leaks", str(db), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["inventoried_steps"] == [0, 2, 4, 6, 8, 10]
    assert (doc["from"], doc["to"]) == (0, 10)
    top = doc["diff"][0]
    assert top["shape"] == [32, 256] and top["count_delta"] == 10
    assert top["bytes_delta"] == 10 * 32 * 256 * 4
    assert doc["leaks"][0]["held_by"] == "__main__.features"
    out = memscope("leaks", str(db), "--from", "4", "--to", "8", "--json")
    doc = json.loads(out.stdout)
    assert doc["diff"][0]["count_delta"] == 4
    text = memscope("leaks", str(db)).stdout
    assert "LEAK" in text and "__main__.features" in text
    assert "stored at examples/leaks/detached_list.py:24" in text and "forward of 1" in text
    bad = memscope("leaks", str(db), "--from", "3")
    assert bad.returncode == 2 and "not an inventoried step" in bad.stderr and "Traceback" not in bad.stderr
    db0 = tmp_path / "off.db"
    out = memscope("attach", "--headless", "--db", str(db0), "--inventory-every", "0",
                   str(LEAKS / "detached_list.py"), "--steps", "3")
    assert out.returncode == 0, out.stderr
    bad = memscope("leaks", str(db0))
    assert bad.returncode == 2 and "no tensor inventory" in bad.stderr
    assert report_json(db0)["leaks"] == []
    bad = memscope("attach", "--headless", "--db", str(tmp_path / "x.db"), "--inventory-every", "-1",
                   str(LEAKS / "detached_list.py"))
    assert bad.returncode == 2 and "inventory_every" in bad.stderr


_FREED = r'''
import gc, sys, weakref
import torch, torch.nn as nn, torch.nn.functional as F
import memscope

memscope.start(sys.argv[1], inventory_every=1, layers_every=1, sample_hz=50)
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
opt = torch.optim.Adam(model.parameters())
history, kept = [], []
for step in range(10):
    x = torch.randn(8, 16)
    loss = F.cross_entropy(model(x), torch.randint(0, 4, (8,)))
    opt.zero_grad()
    loss.backward(retain_graph=True)
    opt.step()
    history.append(loss)           # a retained graph: a suspect, searched for a holder
    kept.append(x.detach() * 2)    # a plain growing list
memscope.stop()
print("tracing off" if sys.gettrace() is None and
      torch.overrides._get_current_function_mode() is None else "still tracing", file=sys.stderr)
types = {torch.Tensor, nn.Parameter}
refs = [weakref.ref(o) for o in gc.get_objects() if type(o) in types]
del model, opt, history, kept, x, loss
gc.collect()
alive = [r for r in refs if r() is not None]
print(len(refs), len(alive))
'''


def test_user_tensors_freed_after_stop(tmp_path: Path) -> None:
    script = tmp_path / "freed.py"
    script.write_text(_FREED)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "run.db")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    # refs include the inputs and activations the retained graphs saved (their Python objects
    # outlive the variables that named them while a graph holds them)
    seen, alive = map(int, out.stdout.split())
    assert seen > 20 and alive == 0
    with sqlite3.connect(tmp_path / "run.db") as conn:
        n = conn.execute("SELECT count(*) FROM inventories").fetchone()[0]
        holders = [r[0] for r in conn.execute("SELECT held_by FROM leak_holders")]
        sites = {r[0].rsplit("/", 1)[-1] for r in conn.execute(
            "SELECT site FROM leak_holders WHERE site IS NOT NULL")}
    assert n == 10
    assert "__main__.history" in holders and "__main__.kept" in holders
    # creation-site capture ran too (mode, forward hooks, line tracer), and let go of everything
    assert sites == {"freed.py:16", "freed.py:17"}
    assert "tracing off" in out.stderr


def test_schema_v2_file_migrates_to_v3(tmp_path: Path) -> None:
    from memscope.store import schema

    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"PRAGMA application_id = {schema.APPLICATION_ID}")
    for target in range(2):
        for st in schema._split_statements(schema.MIGRATIONS[target]):
            conn.execute(st)
    conn.execute("PRAGMA user_version = 2")
    migrate(conn)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 3
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"inventories", "inventory_groups", "leak_holders"} <= names
    assert 3 in [r[0] for r in conn.execute("SELECT version FROM migrations")]
    conn.close()


def test_inventory_cadence_stretches_to_the_time_budget() -> None:
    from memscope.agent.config import AgentOptions
    from memscope.agent.inventory import InventoryCollector

    c = InventoryCollector(every=5, budget=0.02)
    assert not c.due(0) and c.due(2)  # under a budget, no inventory of the warm-up steps
    c.schedule(0, cost_s=0.015, step_s=0.010)  # 15 ms inventory, 10 ms steps: 75 steps apart
    assert not c.due(74) and c.due(75)
    c.schedule(75, cost_s=0.001, step_s=0.5)  # cheap against slow steps: the minimum applies
    assert not c.due(79) and c.due(80)
    exact = InventoryCollector(every=1, budget=0.0)
    assert exact.due(0)
    exact.schedule(3, cost_s=10.0, step_s=0.001)
    assert exact.due(4)
    # naming a cadence keeps it exactly; the default cadence has the budget
    assert AgentOptions.from_mapping({"inventory_every": 1}).inventory_budget == 0.0
    assert AgentOptions.from_mapping({}).inventory_budget == 0.01
    assert AgentOptions.from_mapping({"inventory_every": 2, "inventory_budget": 0.1}).inventory_budget == 0.1


def test_frame_local_holder_keeps_nothing_alive() -> None:
    """A local of a running function is named on every Python version; reading the frame's
    locals (a snapshot dict before 3.13) keeps no tensor alive, and a ``locals()`` dict the
    function holds itself is left as it was."""
    import gc
    import weakref

    import torch

    from memscope.agent.inventory import find_holder

    def train() -> tuple[Any, bool, bool]:
        history = [torch.randn(3)]
        big = torch.randn(1000)
        ref = weakref.ref(big)
        found = find_holder(history[0])
        del big
        gc.collect()
        freed = ref() is None
        mine = locals()
        find_holder(history[0])
        return found, freed, "history" in mine and "ref" in mine

    found, freed, intact = train()
    assert found == (f"{__name__}.test_frame_local_holder_keeps_nothing_alive.<locals>.train"
                     ".<locals>.history", True)
    assert freed and intact

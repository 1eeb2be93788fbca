"""Who holds which module, from torch's registration hooks (memscope.agent.torchcompat.module_parents):
the walk up to a model's outermost container without a heap walk where the registry knows, gc
where it does not, in process; and under attach, the first profiled step names its layers
without a single ``gc.get_referrers`` walk."""

from __future__ import annotations

import copy
import gc
import textwrap
import weakref
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch.nn as nn

from conftest import cli, memscope
from memscope.agent.torchcompat.module_names import outermost
from memscope.agent.torchcompat.module_parents import module_parents


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        self.blocks = nn.ModuleList([nn.Linear(2, 2)])


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each gc.get_referrers call (the heap walk the registry saves)."""
    calls: list[int] = []
    real = gc.get_referrers

    def counted(*objs: Any) -> list[Any]:
        calls.append(1)
        return real(*objs)

    monkeypatch.setattr(gc, "get_referrers", counted)
    return calls


@pytest.fixture
def registry() -> Iterator[None]:
    """Started as attach's agent starts it: before any module of the test exists."""
    module_parents.start(complete=True)
    try:
        yield
    finally:
        module_parents.stop()


def test_modules_built_since_the_start_are_named_without_a_heap_walk(registry: None, walks: list[int]) -> None:
    holder = Holder()
    tail = holder.net[1:]  # a slice sharing children: the model still wins
    assert outermost(holder.net[2]) == (holder, "net.2")
    assert outermost(holder.net[1]) == (holder, "net.1")  # a ReLU registers nothing itself
    assert outermost(holder) == (holder, "")
    new = nn.Linear(2, 2)
    holder.blocks.insert(0, new)  # a direct _modules write, renumbering the others
    assert outermost(new) == (holder, "blocks.0")
    assert outermost(holder.blocks[1]) == (holder, "blocks.1")
    del holder.net  # the slice is its children's only holder now (it keeps the model's keys)
    assert outermost(tail[0]) == (tail, "1")
    assert walks == []


def test_copies_and_bare_roots_are_asked_of_gc(registry: None, walks: list[int]) -> None:
    holder = Holder()
    twin = copy.deepcopy(holder)  # an EMA model, say: built by __setstate__, which registers nothing
    assert outermost(twin.net[2]) == (twin, "net.2")
    assert walks, "a copy's holder is a copy the hooks never saw: gc must be asked"
    walks.clear()
    loss = nn.MSELoss()  # registers nothing: unknown to the registry
    assert outermost(loss) == (loss, "")
    assert walks


def test_a_late_start_asks_gc(walks: list[int]) -> None:
    holder = Holder()  # built before the registry, as under memscope.start() or attach --pid
    module_parents.start(complete=False)
    try:
        assert outermost(holder.net[2]) == (holder, "net.2")
    finally:
        module_parents.stop()
    assert walks


def test_the_registry_keeps_no_module_alive(registry: None) -> None:
    holder = Holder()
    gone = weakref.ref(holder.net[0])
    seen = len(module_parents._seen)
    assert seen >= 4  # the holder, its Sequential and ModuleList, the Linears
    del holder
    gc.collect()
    assert gone() is None
    assert len(module_parents._seen) == 0


def test_attach_names_the_first_profiled_step_without_a_heap_walk(tmp_path: Path) -> None:
    """A real training under attach: gc.get_referrers counted from before torch's import; the
    layers of step 1 named as the model names them."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import gc
        calls = []
        real = gc.get_referrers
        def counted(*objs):
            calls.append(1)
            return real(*objs)
        gc.get_referrers = counted
        import torch
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
                self.head = nn.Linear(64, 8)
            def forward(self, x):
                return self.head(self.body(x))

        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(3):
            loss = model(torch.randn(32, 64)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print("referrer walks:", len(calls))
    """))
    db = tmp_path / "run.db"
    out = memscope("attach", "--headless", "-q", "--db", str(db), str(script))
    assert out.returncode == 0, out.stderr
    assert "referrer walks: 0" in out.stdout, out.stdout
    layers = cli("layers", str(db), "--step", "1")
    assert layers.returncode == 0, layers.stderr
    names = {line.split()[0] for line in layers.stdout.splitlines()[2:] if line.strip()}
    assert {"body.0", "body.1", "body.2", "head"} <= names, layers.stdout

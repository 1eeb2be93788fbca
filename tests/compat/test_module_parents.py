"""Who holds which module, from torch's registration hooks (memscope.agent.torchcompat.module_parents):
the walk up to a model's outermost container without a heap walk where the registry knows, gc
where it does not, in process (under attach: tests/test_torch_import_start.py)."""

from __future__ import annotations

import copy
import gc
import weakref
from typing import Any, Iterator

import pytest
import torch.nn as nn

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

"""The live-tensor registry and the inventory schedule, in this process: every live tensor is
found without walking every object, nothing is kept alive, and the cadence is what the docs say."""

from __future__ import annotations

import gc
import os
import weakref
from typing import Any

import pytest
import torch

from memscope.agent.collectors.inventory import LiveTensors, Schedule, find_holder, take_inventory
from memscope.agent.collectors.inventory.schedule import ALLOWANCE_S, DENSE_STEPS


def found(reg: LiveTensors, objs: list[torch.Tensor]) -> int:
    ids = {id(t) for t in objs}
    tensors = reg.tensors()
    try:
        return sum(1 for t in tensors if id(t) in ids)
    finally:
        tensors.clear()


def test_registry_finds_tensors_promoted_by_collections(live: LiveTensors) -> None:
    kept = []
    for _ in range(3000):  # enough allocations for generation-1 and -2 collections in between
        kept.append(torch.zeros(1))
        _ = [[j] for j in range(8)]
    gc.collect()  # everything is in the oldest generation now: only the gc hook saw it go there
    assert found(live, kept) == len(kept)
    assert not live.last_full


def test_registry_finds_subclasses_defined_later(live: LiveTensors) -> None:
    class Late(torch.Tensor):
        pass

    kept = [torch.zeros(2).as_subclass(Late) for _ in range(50)]
    gc.collect()
    assert found(live, kept) == 50 and not live.last_full


def test_registry_keeps_nothing_alive(live: LiveTensors) -> None:
    t = torch.zeros(1000)
    ref = weakref.ref(t)
    gc.collect()
    assert found(live, [t]) == 1
    del t
    gc.collect()
    assert ref() is None
    assert found(live, []) == 0


def test_registry_walks_everything_when_it_cannot_trust_itself(live: LiveTensors) -> None:
    t = torch.zeros(3)
    assert found(live, [t]) == 1
    hidden = torch.zeros(4)  # made since the last look, then frozen: no walk sees it
    gc.freeze()  # objects moved where no collection reports them
    try:
        # what the registry knew before is still known (a walk alone would miss it now)
        assert found(live, [t, hidden]) == 1 and not live.last_full
        gc.collect(0)
    finally:
        gc.unfreeze()  # into the oldest generation: a full walk, at the inventory after a collection
    gc.collect(0)
    assert found(live, [t, hidden]) == 2 and live.last_full
    assert found(live, [t, hidden]) == 2 and not live.last_full
    live.remove()
    assert live._hook not in gc.callbacks


def test_inventory_counts_groups_and_retained_graphs(live: LiveTensors) -> None:
    w = torch.randn(8, 8, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    kept = [torch.zeros(5, 7) for _ in range(4)]
    total = 0
    for _ in range(6):
        loss = (torch.randn(2, 8) @ w).relu().sum()
        loss.backward()
        opt.step()
        total = total + loss  # retained graph nodes, no saved tensors left
    inv = take_inventory(live, [opt])
    groups = {(sig[0], sig[2], sig[5]): g for sig, g in inv.groups.items()}
    assert groups[("other", "[5, 7]", None)].count == 4
    assert groups[("parameters", "[8, 8]", None)].count == 1
    assert groups[("gradients", "[8, 8]", None)].count == 1
    chain = groups[("activations", "[]", "AddBackward0")]
    assert chain.count == 1 and chain.graph_nodes >= 6 * 3  # sum, relu, mm per step
    assert inv.graph_nodes >= chain.graph_nodes and not inv.full
    del kept, total, loss


def test_exact_cadence() -> None:
    s = Schedule(every=3, budget=0.0)
    due = []
    for step in range(10):
        s.observe(0.01, None)
        if s.due(step):
            due.append(step)
            s.taken(step, 10.0)  # cost does not matter: exactly every 3 steps
    assert due == [0, 3, 6, 9]
    assert not Schedule(every=0, budget=0.01).due(0)


def test_automatic_cadence_dense_then_thinning() -> None:
    s = Schedule(every=1, budget=0.01)
    due = []
    for step in range(200):
        s.observe(0.01, None)
        if s.due(step):
            due.append(step)
            s.taken(step, 0.0001)
    assert due[:DENSE_STEPS + 16] == list(range(DENSE_STEPS + 16))  # every step through step 31
    gaps = [b - a for a, b in zip(due, due[1:])]
    assert 170 // 16 <= gaps[-1] <= 199 // 16 and len(due) < 90  # the interval grows with the run


def test_automatic_cadence_keeps_the_budget() -> None:
    s = Schedule(every=1, budget=0.01)
    spent = 0.0
    for step in range(2000):
        s.observe(0.01, None)  # 10 ms steps, 20 ms inventories: 1% allows one per 200 steps
        if s.due(step):
            s.taken(step, 0.02)
            spent += 0.02
    assert spent <= 0.01 * 2000 * 0.01 + ALLOWANCE_S + 0.02


def test_rising_memory_pulls_an_inventory_forward() -> None:
    s = Schedule(every=1, budget=0.01)
    for step in range(400):
        s.observe(0.01, 100 << 20)
        if s.due(step):
            s.taken(step, 0.0001)
    last = s.last
    assert last is not None and 400 - last < 400 // 16
    level = 100 << 20
    step = 400
    while not s.due(step):  # memory rises by 64 KiB a step from here
        level += 64 << 10
        step += 1
        s.observe(0.01, level)
    assert step - 400 <= 4 and s.pulled == 1


def test_find_holder_local_and_frames_left_clean() -> None:
    """A local of a running function is named; reading the frame's locals (a snapshot dict
    before 3.13) keeps no tensor alive, and a ``locals()`` dict the function holds itself is
    left as it was."""

    def train() -> tuple[object, bool, bool]:
        history = [torch.randn(3)]
        big = torch.randn(1000)
        ref = weakref.ref(big)
        holder = find_holder(history[0])
        del big
        gc.collect()
        freed = ref() is None
        mine = locals()
        find_holder(history[0])
        return holder, freed, "history" in mine and "ref" in mine

    holder, freed, intact = train()
    assert holder == (f"{__name__}.test_find_holder_local_and_frames_left_clean.<locals>.train"
                      ".<locals>.history")
    assert freed and intact


def test_after_fork_drops_the_hook(live: LiveTensors) -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what a DataLoader worker gets
        live.after_fork()
        os.write(w, b"1" if live._hook not in gc.callbacks else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    assert live._hook in gc.callbacks  # the parent keeps its registry


def test_saved_tensors_a_walk_read_are_not_taken_for_live_ones(live: LiveTensors,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a saved tensor gives it a Python object that torch keeps while its graph lives;
    the registry finds it at the next collection. It stays graph memory: the next inventory
    counts the same tensors and bytes, and still walks a sample of a big kind, not every graph."""
    from memscope.agent.collectors.inventory import graph, scan

    w = torch.randn(64, requires_grad=True)
    kept = [w.sin().cos() for _ in range(200)]  # cos saves sin's output: held by no Python code
    walks = []
    real_walk = graph.GraphWalker.walk

    def counting(self: graph.GraphWalker, fn: object, own: int) -> tuple[int, int]:
        walks.append(1)
        return real_walk(self, fn, own)

    monkeypatch.setattr(graph.GraphWalker, "walk", counting)
    gc.collect()
    first = take_inventory(live, [])
    gc.collect()  # the saved tensors the first walk read are registered now
    walks.clear()
    second = take_inventory(live, [])
    assert len(walks) == scan.GRAPH_SAMPLE
    assert (second.tensors, second.bytes, second.graph_bytes, second.graph_nodes) == \
        (first.tensors, first.bytes, first.graph_bytes, first.graph_nodes)
    (cos,) = [g for sig, g in second.groups.items() if sig[5] == "CosBackward0"]
    # each graph saves sin's output (64 floats); w, which they all save, is charged once; nodes:
    # 200 cos, 200 sin (w's AccumulateGrad, shared by all, is w's: not counted)
    assert cos.count == 200 and cos.graph_bytes == 200 * 64 * 4 + 64 * 4 and cos.graph_nodes == 400
    del kept


def test_collector_disabled_each_inventory_looks_only_at_what_was_made_since(live: LiveTensors) -> None:
    """``gc.disable()`` (some training loops do it for speed; torchtitan collects by hand every N
    steps): generation 0 then holds every object made since. An inventory looks past its mark."""
    assert found(live, []) == 0
    gc.disable()
    try:
        junk = [[i] for i in range(50_000)]  # what a script made with the collector off
        before = [torch.zeros(1) for _ in range(5)]
        assert found(live, before) == 5 and live.looked_at >= 50_000
        after = [torch.zeros(1) for _ in range(7)]
        assert found(live, before + after) == 12 and live.looked_at < 1_000
        assert found(live, before + after) == 12 and live.looked_at < 100
        gc.collect(0)  # a collection moved the mark: the whole young generations, once
        more = [torch.ones(1) for _ in range(3)]
        assert found(live, before + after + more) == 15 and live.looked_at >= 50_000
        assert found(live, more) == 3 and live.looked_at < 100
    finally:
        gc.enable()
    assert not live.last_full and len(junk) == 50_000


def test_frozen_objects_that_die_are_no_unfreeze(live: LiveTensors) -> None:
    gone = [[i] for i in range(1000)]
    gc.freeze()
    try:
        assert found(live, []) == 0
        gone.clear()
        gc.collect(0)
        kept = torch.zeros(2)
        assert found(live, [kept]) == 1 and not live.last_full
    finally:
        gc.unfreeze()


def test_a_tensor_another_thread_makes_while_a_walk_lists_is_found_by_the_next(
        live: LiveTensors, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next walk's mark is made before this walk lists generation 0: a tensor made in
    between (a loader thread's, say) is past it, not skipped by every walk after."""
    import memscope.agent.collectors.inventory.live as module

    made: list[torch.Tensor] = []
    listing = gc.get_objects

    class Racing:  # gc, except that listing generation 0 lets "another thread" make a tensor once
        def __getattr__(self, name: str) -> Any:
            return getattr(gc, name)

        def get_objects(self, *generation: int) -> list[Any]:
            objects = listing(*generation)
            if generation == (0,) and not made:
                made.append(torch.zeros(3))
            return objects

    gc.disable()  # no collection: only the mark decides what the next walk looks at
    try:
        assert found(live, []) == 0
        monkeypatch.setattr(module, "gc", Racing())
        assert found(live, made) == 0 and len(made) == 1  # made after this walk's list
        monkeypatch.setattr(module, "gc", gc)
        assert found(live, made) == 1 and live.since_mark
    finally:
        gc.enable()

"""An inventory counts a live tensor that a live graph saved once, in the graph's bytes, not
again on its own: what tensor bytes plus graph bytes grew by over a test equals what an
independent count of every storage that live tensors and their graphs hold (gc walk + public
``_saved_*`` attributes) grew by. Growth, not totals: on an xdist worker the process also holds
what earlier test files left (FakeTensors in torch.compile's caches, say), the same at both ends."""

from __future__ import annotations

import gc
from typing import Any

import torch
import torch.nn as nn

from memscope.agent.collectors.inventory import LiveTensors, signature, take_inventory


def _add(sizes: dict[int, int], t: Any) -> None:
    """``t``'s storage by address, unless it has no memory of its own: meta, a FakeTensor's (meta
    storage, or one whose address raises: earlier torch.compile tests leave their graphs behind)."""
    if t.layout is not torch.strided or t.device.type == "meta":
        return
    s = t.untyped_storage()
    try:
        if s.device.type != "meta" and s.data_ptr():
            sizes[s.data_ptr()] = s.nbytes()
    except RuntimeError:  # a FakeTensor's or FunctionalTensor's
        pass


def _truth() -> int:
    """Bytes of the distinct storages live tensors and the graphs they reach hold, found without
    memscope: the gc's tensors first, then each graph's saved tensors (unpacking them makes
    Python objects, so the live set is taken before)."""
    live = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]  # type: lazy proxies warn
    sizes: dict[int, int] = {}
    fns: list[Any] = []
    for t in live:
        _add(sizes, t)
        if t.grad_fn is not None:
            fns.append(t.grad_fn)
    live.clear()
    seen: set[int] = set()
    while fns:
        fn = fns.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        for name in dir(fn):
            if name.startswith("_saved_"):
                v = getattr(fn, name)
                for x in (v if isinstance(v, (tuple, list)) else [v]):
                    if isinstance(x, torch.Tensor):
                        _add(sizes, x)
        fns.extend(n for n, _ in fn.next_functions if n is not None)
    return sum(sizes.values())


def _both(live: LiveTensors, optimizers: list[Any]) -> tuple[Any, int]:
    """An inventory and the independent count, of the same moment."""
    gc.collect()
    inv = take_inventory(live, optimizers)
    assert not inv.truncated
    return inv, _truth()


def _check(live: LiveTensors, opt: Any, before: tuple[Any, int]) -> Any:
    inv, truth = _both(live, [opt])
    assert inv.bytes + inv.graph_bytes - (before[0].bytes + before[0].graph_bytes) == truth - before[1]
    return inv


def _model() -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt


def test_an_input_every_kept_graph_saved_is_in_their_bytes_not_counted_again(live: LiveTensors) -> None:
    before = _both(live, [])
    model, opt = _model()
    x = torch.randn(16, 32)  # held by the script and saved by each output's first matmul
    outputs = [model(x) for _ in range(5)]  # an evaluation without no_grad(), kept
    inv = _check(live, opt, before)
    assert signature("other", x) not in inv.groups
    assert inv.groups[signature("activations", outputs[0])].count == 5
    assert inv.graph_bytes >= x.untyped_storage().nbytes()


def test_retain_graph_intermediates_held_by_the_script_counted_once(live: LiveTensors) -> None:
    before = _both(live, [])
    model, opt = _model()
    x = torch.randn(16, 32)
    h = model[0](x)
    r = torch.relu(h)
    out = model[2](r)
    out.sum().backward(retain_graph=True)
    inv = _check(live, opt, before)
    assert signature("activations", r) not in inv.groups  # saved by the second matmul: in its graph
    assert inv.groups[signature("activations", h)].count == 1  # relu saves its result, not h
    assert inv.groups[signature("activations", out)].count == 1


def test_a_chain_of_more_roots_than_the_sample_each_saving_the_last(live: LiveTensors) -> None:
    before = _both(live, [])
    _, opt = _model()
    c = torch.randn(64, requires_grad=True)
    chain = [c]
    for _ in range(40):  # more roots of one kind than GRAPH_SAMPLE: each saves the one before
        chain.append(chain[-1].sin())
    inv = _check(live, opt, before)
    # the newest is the outermost root: every older one is in its graph's bytes
    assert inv.groups[signature("activations", chain[-1])].count == 1


def test_graphs_of_tensors_without_memory_add_nothing(live: LiveTensors) -> None:
    """What torch.compile's tests leave in an xdist worker: FakeTensor and FunctionalTensor graphs
    (their storages' addresses raise). Neither count takes them, and neither raises."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    before = _both(live, [])
    _, opt = _model()
    with FakeTensorMode():
        a = torch.randn(1024, requires_grad=True)
    with FunctionalTensorMode():
        kept = FunctionalTensor.to_functional(a).sin().cos()
    inv = _check(live, opt, before)
    assert kept.grad_fn is not None
    assert inv.bytes + inv.graph_bytes - (before[0].bytes + before[0].graph_bytes) == _model_bytes(opt)


def _model_bytes(opt: Any) -> int:
    return sum(p.untyped_storage().nbytes() for g in opt.param_groups for p in g["params"])


def _nodes() -> int:
    """Distinct autograd nodes live tensors' graphs keep, but parameters' AccumulateGrad (shared
    by every graph, not counted by an inventory), found without memscope."""
    todo = [o.grad_fn for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and o.grad_fn is not None]
    seen: set[int] = set()
    keep: list[Any] = []
    n = 0
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        keep.append(fn)
        n += type(fn).__name__ != "AccumulateGrad"
        todo.extend(x for x, _ in fn.next_functions)
    return n


def test_a_kind_most_of_whose_roots_other_graphs_reach(live: LiveTensors) -> None:
    """More roots of one kind than the sample, two in three of them reached by another kind's
    graphs (a traceback keeps a helper's argument and what the helper made from it, beside the
    loop's own tensor of that kind): what the rest are charged is the median of the sampled roots
    no other graph reached, and a reached root is charged nothing (its nodes are the other
    graph's). Counted, the nodes equal an independent walk's."""
    gc.collect()
    inv0, nodes0 = take_inventory(live, []), _nodes()
    lin = nn.Linear(8, 8)
    kept = []
    for _ in range(20):
        a = lin(torch.randn(4, 8))  # no other graph reaches it
        b, c = lin(torch.randn(4, 8)), lin(torch.randn(4, 8))
        kept.append((a, b, c, b * 3.0, c * 2.0))  # b and c: reached from the products' graphs
    gc.collect()
    inv = take_inventory(live, [])
    assert not inv.truncated
    assert inv.graph_nodes - inv0.graph_nodes == _nodes() - nodes0 == 20 * 2 + 40 * 3


def test_nodes_two_kinds_share_go_to_one_kind_whatever_order_they_are_listed_in(live: LiveTensors) -> None:
    """A helper's local and an output both made from one hidden layer, kept for 50 and 40 steps
    (more roots of each kind than the sample): the hidden layer's nodes go to the kind the
    inventories met first (the local here), also when the output is made, and so listed, first
    each step (kinds walked in the order gc or the registry lists them moved the charge between
    inventories; with the output's kind first, its median also missed the lone locals' nodes:
    259 of 280). The once-only half (a node under a root charged its kind's median is not walked
    again from another kind's root) is test_real_leaks' nodes-two-groups-share test."""
    lin0, lin1 = nn.Linear(7, 13), nn.Linear(13, 5)  # shapes no other test makes: kinds met here first
    charged = []
    for local_first in (True, False):
        gc.collect()
        inv0, nodes0 = take_inventory(live, []), _nodes()
        kept = []
        for i in range(50):
            hidden = torch.relu(lin0(torch.randn(11, 7)))
            if local_first:
                local = hidden * 2.0
                out = lin1(hidden) if i < 40 else None
            else:
                out = lin1(hidden) if i < 40 else None
                local = hidden * 2.0
            kept.append((out, hidden, local))
        del hidden, out, local
        gc.collect()
        inv = take_inventory(live, [])
        assert not inv.truncated
        assert inv.graph_nodes - inv0.graph_nodes == _nodes() - nodes0
        sigs = {"out": signature("activations", kept[0][0]), "local": signature("activations", kept[0][2])}
        charged.append({k: inv.groups[sig].graph_nodes - (inv0.groups[sig].graph_nodes if sig in inv0.groups else 0)
                        for k, sig in sigs.items()})
        kept.clear()
    assert charged[0] == charged[1] == {"out": 80, "local": 200}, charged

"""Module names as the model the user built names them (memscope.agent.torchcompat.module_names), in
process: the outermost container, wrappers transparent."""

from __future__ import annotations

import torch
import torch.nn as nn

from memscope.agent.torchcompat.module_names import dotted_names, outermost


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def test_a_submodule_is_named_in_its_outermost_container() -> None:
    holder = Holder()
    top, path = outermost(holder.net[2])
    assert top is holder and path == "net.2"
    assert outermost(holder) == (holder, "")
    names = dotted_names(holder)
    assert names[id(holder.net)] == "net" and names[id(holder.net[0])] == "net.0"


def test_a_slice_sharing_children_does_not_win_over_the_model() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU())
    tail = model[2:]  # a second Sequential holding the same children
    top, path = outermost(model[3])
    assert top is model and path == "3"
    del tail


def test_wrappers_take_the_name_of_what_they_wrap() -> None:
    holder = Holder()
    holder.net = torch.compile(holder.net, backend="eager")  # an OptimizedModule, not called
    names = dotted_names(holder)
    assert names[id(holder.net)] == "net" and names[id(holder.net._orig_mod)] == "net"
    assert names[id(holder.net._orig_mod[2])] == "net.2"
    assert outermost(holder.net._orig_mod[2]) == (holder, "net.2")
    compiled = torch.compile(nn.Sequential(nn.Linear(4, 4)), backend="eager")
    assert dotted_names(compiled)[id(compiled._orig_mod[0])] == "0"


MODEL = nn.Sequential(nn.Linear(4, 4), nn.ReLU())  # a script's model: held by a module's globals


def test_a_model_held_by_globals_costs_one_walk_of_the_heap(monkeypatch) -> None:
    """The usual root (a model in the script's globals) is answered after one gc.get_referrers
    walk: a dict holding other things than modules is no module's ``_modules`` (each walk costs
    tens of ms in a big process, on the training thread at the first profiled step). A dict of
    modules alone is still followed up: a user's ``{"net": model}`` is looked into, as before."""
    import gc

    from memscope.agent.torchcompat import module_names

    walks: list[int] = []
    real = gc.get_referrers

    def counting(*objs):
        walks.append(len(objs))
        return real(*objs)

    monkeypatch.setattr(module_names, "gc", type("G", (), {"get_referrers": staticmethod(counting)}))
    assert outermost(MODEL) == (MODEL, "")
    assert len(walks) == 1
    walks.clear()
    holder = Holder()
    assert outermost(holder.net) == (holder, "net")  # a real _modules dict: its owner is looked up
    assert len(walks) >= 2

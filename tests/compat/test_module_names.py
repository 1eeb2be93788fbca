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

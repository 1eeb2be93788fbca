"""A model held by another module (as a framework holds it), whose first layer is called on
its own before the whole model, and a loss module called on its own: ``submodule_first.py OUT``.
Names must be the outer module's own dotted names (``net.0``), never ``0`` or ``Sequential:0``."""

import sys

import torch
import torch.nn as nn

from _common import finish, seed


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


seed()
holder = Holder()
criterion = nn.CrossEntropyLoss()
opt = torch.optim.SGD(holder.parameters(), lr=0.1)
losses = []
for step in range(8):
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    probe = holder.net[0](x)  # a submodule on its own, before the whole model
    loss = criterion(holder.net(x), y) + 0.0 * probe.sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
finish(sys.argv[1], losses, holder)

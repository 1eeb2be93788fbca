"""Activation checkpointing, all three forms in one model: ``checkpointing.py OUT``.

block_a: checkpoint(..., use_reentrant=True); block_b: checkpoint(..., use_reentrant=False);
tail: checkpoint_sequential(..., 2 segments, use_reentrant=False).
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from _common import finish, seed

STEPS = 8


def block() -> nn.Sequential:
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.LayerNorm(32))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.block_a = block()
        self.block_b = block()
        self.tail = nn.Sequential(*block(), *block())
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = checkpoint(self.block_a, h, use_reentrant=True)
        h = checkpoint(self.block_b, h, use_reentrant=False)
        h = checkpoint_sequential(self.tail, 2, h, use_reentrant=False)
        return self.head(h)


seed()
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
losses = []
for step in range(STEPS):
    x, y = torch.randn(16, 16), torch.randint(0, 4, (16,))
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
finish(sys.argv[1], losses, model)

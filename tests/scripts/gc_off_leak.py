"""A leak in a script that turns the garbage collector off (``gc.disable()``) or freezes it
(``gc.freeze()``), as some training scripts do for speed. argv: disable|freeze, steps, and
optionally N: ``gc.collect(1)`` every N steps (torchtitan's way: the collector off, a young
collection by hand now and then)."""
import gc
import sys

import torch
import torch.nn as nn

mode, steps = sys.argv[1], int(sys.argv[2])
collect_every = int(sys.argv[3]) if len(sys.argv) > 3 else 0
getattr(gc, mode)()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept = []
for step in range(steps):
    x = torch.randn(16, 64)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    kept.append(x * 2)  # the leak: 4 KiB a step
    if collect_every and step % collect_every == 0:
        gc.collect(1)

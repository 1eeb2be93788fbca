"""A compiled model whose losses are kept with their graphs (a leak): ``compiled_leak.py OUT``."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import dynamo_counters, finish, seed

seed()
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
run = torch.compile(model, backend="aot_eager", fullgraph=True)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept = []
for step in range(12):
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    loss = F.cross_entropy(run(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    kept.append(loss)  # the leak
finish(sys.argv[1], [k.item() for k in kept], model, dynamo=dynamo_counters())

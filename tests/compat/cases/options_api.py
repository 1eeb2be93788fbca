"""The README's options through the Python API: ``options_api.py DB {start,profile} JSON`` where
JSON holds the keyword arguments. Trains 8 steps of a tiny model (max_steps may end it first)."""

import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import memscope

db, entry, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])


def train() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()


if entry == "start":
    memscope.start(db, **kwargs)
    train()
    memscope.stop()
else:
    with memscope.profile(db, **kwargs):
        train()

"""Builds a model, then opens files until the process has no descriptor left, then trains on
(issue 21: ulimit -n 64). Argument: the number of steps (25)."""

import os
import sys
import torch
import torch.nn as nn
model = nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
held = []
try:
    while True:
        held.append(open(os.devnull))
except OSError:
    pass
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 25):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
print("trained", len(held), flush=True)

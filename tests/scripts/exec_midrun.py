"""Trains 6 steps, then replaces itself with ``os.execv`` (the same script, ``--after``), which
trains 3 more steps (tests/test_nothing_lost.py). The exec follows the last step at once: a
writer that did not flush first would lose the steps since its last flush."""

import os
import sys

import torch

after = "--after" in sys.argv
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3 if after else 6):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
if not after:
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "--after", "--token", "EXECSECRET"])

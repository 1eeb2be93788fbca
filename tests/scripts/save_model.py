"""Trains a small model 3 steps, then ``torch.save``s the whole module (its hooks, if any, with
it) to argv[1]; with argv[2] == "script" also ``torch.jit.script``s it (which fails on a model
carrying hooks). Run under ``memscope attach`` by tests/test_oom_at_failure.py and tests/test_oom.py."""
import os
import sys

import torch

model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
torch.save(model, sys.argv[1])
scripted = torch.jit.script(model) if sys.argv[2] == "script" else None
print("saved", os.path.getsize(sys.argv[1]), "bytes, scripted", scripted is not None)

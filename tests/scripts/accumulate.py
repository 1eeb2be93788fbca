"""Micro-batches of the given sizes per optimizer.step() (gradient accumulation): the script of
tests/test_layers_accumulation.py, docs/layers.md's sample and the dashboard's per-micro-batch test."""
import sys
import torch
import torch.nn as nn

torch.manual_seed(0)
sizes = [int(s) for s in sys.argv[1].split(",")]  # the micro-batches of one optimizer step
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    for b in sizes:
        loss = model(torch.randn(b, 256)).pow(2).mean() / len(sizes)
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

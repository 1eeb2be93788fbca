"""A steady training loop whose memory spikes once: step --spike-at holds an extra --spike-mb
of touched memory until its backward is done, then frees it (the run's peak is that step)."""

import argparse

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--spike-at", type=int, default=70)
p.add_argument("--spike-mb", type=int, default=96)
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 32), torch.randn(16, 1)
for step in range(args.steps):
    extra = torch.ones(args.spike_mb * 2**18) if step == args.spike_at else None  # float32: 4 B each
    loss = (model(x) - y).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    del extra
print(f"done {args.steps}")

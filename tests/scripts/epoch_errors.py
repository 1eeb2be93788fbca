"""Exceptions kept per epoch: the check raises inside a helper on one batch of each epoch, and the
epoch's function keeps the exception (``errors.append(e)``). Its traceback keeps the helper's frame
and, once the epoch's function returns, that function's frame too, with its last batch's locals."""
import argparse

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--batches", type=int, default=4, help="batches (steps) per epoch")
args = p.parse_args()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 48))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
errors = []


def check(out, fails):
    scaled = out * 2.0  # a local of the helper that raises
    if fails:
        raise ValueError("output out of range")
    return scaled


def train_epoch(batches):
    for b in range(batches):
        x = torch.randn(16, 64)
        out = model(x)
        loss = out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        try:
            check(out, b == 1)
        except ValueError as e:
            errors.append(e)  # STORE


for epoch in range(args.steps // args.batches):
    train_epoch(args.batches)
print(f"done: {len(errors)} errors kept")

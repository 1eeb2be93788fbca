"""A training that waits before its three steps (tests of what memscope shows while a script runs:
the progress line of estimate, a Ctrl-C in the middle of a fake run). ``--sleep S``."""

import argparse
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--sleep", type=float, default=3.0)
args = p.parse_args()
time.sleep(args.sleep)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):  # estimate's fake run takes 2 steps
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()

"""Trains only in a multiprocessing spawn child (10 steps); with an argument the child calls
memscope.start() first."""

import multiprocessing as mp
import sys
import torch
import torch.nn as nn

def train(n, use_start):
    if use_start:
        import memscope
        memscope.start()
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=train, args=(10, len(sys.argv) > 1))
    p.start()
    p.join()
    sys.exit(p.exitcode)

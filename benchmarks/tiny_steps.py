"""A training loop of tiny steps, the workload of ``overhead.py --tiny``: about 1 ms a step at
width 640 on a 2-core CPU with 2 threads (0.26 ms at width 64), where memscope's per-step work
and its fixed start and end costs weigh most against the training's own."""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--width", type=int, default=640)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, args.width), torch.randint(0, 10, (64,))
    for _ in range(args.steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    print("done", args.steps)


if __name__ == "__main__":
    main()

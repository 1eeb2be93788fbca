"""Data-parallel training on CPU (gloo) with Adam: every rank holds the full parameters,
gradients and optimizer state, what sharding (ZeRO / FSDP) would divide by the world size.

    memscope attach -- torchrun --nproc-per-node 2 examples/scenarios/ddp_adam.py
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--width", type=int, default=512)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(args.width, args.width), nn.GELU(), nn.Linear(args.width, args.width)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        loss = model(torch.randn(8, args.width)).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

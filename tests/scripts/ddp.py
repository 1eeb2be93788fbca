"""DDP on CPU (gloo): used to check every rank is recorded and the launcher is not.

--heavy-rank R --heavy-mb M: rank R keeps an extra M MiB buffer alive from its first step on
(a real imbalance between ranks). --oom-rank R --oom-step S: rank R hits a real allocator
failure (a request no machine can satisfy) in the forward of step S.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--heavy-rank", type=int, default=None)
    p.add_argument("--heavy-mb", type=int, default=256)
    p.add_argument("--oom-rank", type=int, default=None)
    p.add_argument("--oom-step", type=int, default=2)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ballast = None
    for step in range(args.steps):
        if rank == args.heavy_rank and ballast is None:
            ballast = torch.ones(args.heavy_mb * 2 ** 20 // 4)  # ones(): pages touched, RSS grows
        x = torch.randn(8, 16)
        if rank == args.oom_rank and step == args.oom_step:
            x = x.new_empty(2 ** 48, 16)  # ~16 PiB: DefaultCPUAllocator can't allocate memory
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

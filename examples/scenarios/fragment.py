"""A CUDA training loop whose temporaries fragment the caching allocator: each step allocates
many blocks of mixed sizes from the same segments, frees every other one and holds the rest a
moment, leaving inactive split blocks (reserved memory no other request can use). CUDA only.

    memscope attach --sample-hz 200 examples/scenarios/fragment.py
"""

from __future__ import annotations

import argparse
import random
import time

import torch
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--blocks", type=int, default=400)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("fragment.py needs a CUDA GPU")
    random.seed(0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        kept = []
        for i in range(args.blocks):
            # 1-9 MiB: large-pool blocks carved out of shared 20 MiB segments
            t = torch.empty(random.randint(1 << 20, 9 << 20), dtype=torch.uint8, device="cuda")
            if i % 2:
                kept.append(t)
        torch.cuda.synchronize()
        time.sleep(0.1)  # hold the holes while the sampler reads memory_stats()
        loss = model(torch.randn(64, 1024, device="cuda")).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del kept


if __name__ == "__main__":
    main()

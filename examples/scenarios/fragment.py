"""A CUDA training loop whose temporaries fragment the caching allocator: each step allocates
pairs of blocks from shared segments, frees one of each pair and holds the rest a moment while
larger blocks that fit in no hole take new segments, leaving inactive split blocks (reserved
memory no other request can use). CUDA only.

    memscope attach --sample-hz 200 examples/scenarios/fragment.py
"""

from __future__ import annotations

import argparse
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
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        # pairs of 9 MiB blocks carved from shared 20 MiB segments (requests under 10 MiB share
        # segments); freeing the first of each pair leaves a 9 MiB inactive split block per
        # segment, and the 9.5 MiB blocks asked for next fit in none of them: new segments
        pairs = [(torch.empty(9 << 20, dtype=torch.uint8, device="cuda"),
                  torch.empty(9 << 20, dtype=torch.uint8, device="cuda")) for _ in range(args.blocks // 4)]
        kept = [b for _a, b in pairs]
        del pairs
        kept += [torch.empty((19 << 20) // 2, dtype=torch.uint8, device="cuda") for _ in range(args.blocks // 4)]
        torch.cuda.synchronize()
        time.sleep(0.1)  # hold the holes while the sampler reads memory_stats()
        loss = model(torch.randn(64, 1024, device="cuda")).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del kept


if __name__ == "__main__":
    main()

"""Wide Linear layers trained with Adam on a tiny batch: a run dominated by optimizer state
(Adam keeps two fp32 states per parameter), with small activations.

    memscope attach examples/scenarios/wide_adam.py
    memscope attach examples/scenarios/wide_adam.py --freeze   # a frozen base, a small trainable head
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--freeze", action="store_true",
                   help="freeze the wide layers and train only a small head (a fine-tuning run)")
    args = p.parse_args()

    torch.manual_seed(0)
    base = nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.GELU())
                           for _ in range(args.depth)])
    head = nn.Linear(args.width, 8)
    model = nn.Sequential(base, head)
    if args.freeze:
        base.requires_grad_(False)
    opt = torch.optim.Adam([q for q in model.parameters() if q.requires_grad], lr=1e-3)
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.width)
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()

"""A model that runs out of memory at a known step: from --fail-step on, its `expand` layer asks
the allocator for a tensor no machine has (about 3 PB), a real allocator failure on CPU and GPU.

    memscope attach examples/oom.py --fail-step 5
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Expand(nn.Module):
    """Widens its input by ``factor`` (a huge factor is the bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.factor = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.factor == 1:
            return x
        return x.new_empty(x.shape[0], x.shape[1] * self.factor).narrow(1, 0, x.shape[1]).copy_(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--fail-step", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 128), nn.ReLU())
    model.add_module("expand", Expand())
    model.add_module("head", nn.Linear(128, 10))
    model.to(args.device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        if step == args.fail_step:
            # 64 x (128 * 3 * 2**35) float32 = 3377699720527872 bytes requested
            model.expand.factor = 3 * 2**35
        x = torch.randn(64, 128, device=args.device)
        y = torch.randint(0, 10, (64,), device=args.device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()

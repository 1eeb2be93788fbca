"""Blocks where selective checkpointing may not apply (tests/test_sac_limits.py): an MLP block
whose activation is a custom ``torch.autograd.Function`` (``--custom-fn``), and the model under
``torch.compile`` (``--compile``, the aot_eager backend: no C++ compiler needed). Prints the
loss of every step exactly, so that a run with a technique applied can be compared with one
without."""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.nn as nn


class Swish(torch.autograd.Function):
    """x * sigmoid(x), its backward written by hand (keeps x and sigmoid(x))."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(x)
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        x, s = ctx.saved_tensors
        return grad * (s + x * s * (1 - s))


class Block(nn.Module):
    def __init__(self, dim: int, custom: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.custom = custom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(self.norm(x))
        h = Swish.apply(h) if self.custom else torch.nn.functional.silu(h)
        return x + self.down(h)


class Net(nn.Module):
    def __init__(self, dim: int, layers: int, custom: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(Block(dim, custom) for _ in range(layers))
        self.out = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--custom-fn", action="store_true")
    p.add_argument("--compile", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    model: Any = Net(64, 3, args.custom_fn)
    if args.compile:
        model = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x = torch.randn(32, 16, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}", flush=True)


if __name__ == "__main__":
    main()

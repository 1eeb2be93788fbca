"""Shared bits of the leak examples: a small model, data, and the argument parser."""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn


def parse(doc: str | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=256)
    return p.parse_args()


def model_for(width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def batch(n: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, width), torch.randint(0, 10, (n,))

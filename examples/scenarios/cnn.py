"""A small convolutional classifier on synthetic images: a run whose tensors are mostly
activations (feature maps), for the suggestion scenarios and their calibration.

    memscope attach examples/scenarios/cnn.py
    memscope whatif --try activation_checkpointing --try mixed_precision examples/scenarios/cnn.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


def build(width: int, blocks: int, classes: int) -> nn.Sequential:
    layers: list[nn.Module] = [conv_block(3, width)]
    for i in range(blocks):
        layers.append(conv_block(width, width))
        if i % 2 == 1:
            layers.append(nn.MaxPool2d(2))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes)]
    return nn.Sequential(*layers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=32, help="image height and width")
    p.add_argument("--width", type=int, default=32, help="channels")
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    args = p.parse_args()

    torch.manual_seed(0)
    model = build(args.width, args.blocks, 10)
    opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if args.optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9))
    for _ in range(args.steps):
        x = torch.randn(args.batch, 3, args.size, args.size)
        y = torch.randint(0, 10, (args.batch,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()

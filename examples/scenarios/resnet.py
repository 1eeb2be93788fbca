"""A small ResNet-style CNN (convolutions, BatchNorm, residual blocks) on synthetic images: the
convolutional model of the estimate accuracy table (memscope estimate / fit).

    memscope estimate examples/scenarios/resnet.py
    memscope estimate examples/scenarios/resnet.py --optimizer sgd --batch 64
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class SmallResNet(nn.Module):
    def __init__(self, channels: int, blocks: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU())
        self.blocks = nn.ModuleList(ResBlock(channels) for _ in range(blocks))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=32, help="image height and width")
    p.add_argument("--channels", type=int, default=32)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    args = p.parse_args()

    torch.manual_seed(0)
    model = SmallResNet(args.channels, args.blocks, args.classes)
    opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if args.optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, args.size, args.size)
        y = torch.randint(0, args.classes, (args.batch,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 5 == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()

"""A convolutional model and its inputs in channels_last memory format: ``channels_last.py OUT``."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import finish, seed

seed()
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(8, 4)).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for step in range(8):
    x = torch.randn(4, 3, 16, 16).to(memory_format=torch.channels_last)
    y = torch.randint(0, 4, (4,))
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
finish(sys.argv[1], losses, model)

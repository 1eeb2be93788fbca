"""torch.func.functional_call with an explicit parameter dict, updated by hand (no optimizer:
steps end with each backward): ``functional_call.py OUT``."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

from _common import finish, seed

seed()
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
params = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
losses = []
for step in range(8):
    x, y = torch.randn(16, 16), torch.randint(0, 4, (16,))
    loss = F.cross_entropy(functional_call(model, params, (x,)), y)
    loss.backward()
    with torch.no_grad():
        for p in params.values():
            p -= 0.1 * p.grad
            p.grad = None
    losses.append(loss.item())
finish(sys.argv[1], losses, {k: v.detach().clone() for k, v in params.items()})

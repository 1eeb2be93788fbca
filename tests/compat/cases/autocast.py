"""CPU autocast to bfloat16 around the forward: ``autocast.py OUT``."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import finish, seed

seed()
model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.LayerNorm(64),
                      nn.Linear(64, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
losses = []
for step in range(8):
    x, y = torch.randn(16, 16), torch.randint(0, 4, (16,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
    assert logits.dtype == torch.bfloat16
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
finish(sys.argv[1], losses, model)

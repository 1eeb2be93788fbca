"""The script ``memscope attach`` runs with every option of the README: ``options_attach.py``."""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    F.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()

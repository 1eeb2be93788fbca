"""A batch-size finder (Lightning's BatchSizeFinder pattern): halve the batch on a real
allocator failure until it fits. argv: the first batch, and the step (0: none) at which a
second search starts from 64."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Wide(nn.Module):
    def forward(self, x):
        if x.shape[0] > 16:  # stands for "does not fit": a real allocator failure
            torch.empty(2 ** 50)
        return x


model = nn.Sequential(nn.Linear(8, 8), Wide(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batch, steps = int(sys.argv[1]), 0
while steps < 6:
    try:
        loss = F.cross_entropy(model(torch.randn(batch, 8)), torch.randint(0, 2, (batch,)))
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc):
            raise
        batch //= 2  # halve until it fits
        continue
    loss.backward()
    opt.step()
    opt.zero_grad()
    steps += 1
    if steps == int(sys.argv[2]):
        batch = 64  # a second search, later in the run
print("batch", batch)

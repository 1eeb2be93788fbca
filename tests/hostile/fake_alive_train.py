"""A training loop while FakeTensors stay alive, as torch.compile's caches keep some (seen on a
GPU run of a compiled model): memscope's inventories, layer profile and leak sites walk past
them without asking a FakeTensor storage for its data pointer, which warns into the program's
stderr (tests/test_hostile_agent.py)."""

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

with FakeTensorMode():
    FAKES = [torch.empty(1024, 1024), torch.empty(3, 5)]  # 4 MiB that is not memory

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _step in range(6):
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
print("fakes", type(FAKES[0]).__name__, FAKES[0].untyped_storage().device)

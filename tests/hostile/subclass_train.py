"""A training loop whose activations are a tensor subclass that counts its __torch_function__
calls; prints the count. memscope's own inspection must not add to it (tests/test_hostile_agent.py)."""

import sys

import torch
import torch.nn as nn

CALLS = 0


class Counted(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        global CALLS
        CALLS += 1
        return super().__torch_function__(func, types, args, kwargs or {})


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept = []
for _step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    x = torch.randn(8, 16).as_subclass(Counted)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    kept.append(x)  # the subclass tensors stay live: every inventory scan sees them
print(f"torch_function calls {CALLS}")

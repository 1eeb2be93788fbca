"""A training loop that runs its first steps on a worker thread, then goes on on the main
thread, with no saved-tensors hooks of its own (tests/test_hostile_agent.py)."""

import threading

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def train(steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


worker = threading.Thread(target=train, args=(4,), name="user-worker")
worker.start()
worker.join()
train(4)
print("done")

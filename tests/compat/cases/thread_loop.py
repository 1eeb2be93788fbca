"""The training loop on a worker thread; the main thread waits for it: ``thread_loop.py OUT``."""

import sys
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import finish, seed

result = {}


def train() -> None:
    seed()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(8):
        x, y = torch.randn(16, 16), torch.randint(0, 4, (16,))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    result["losses"], result["model"] = losses, model


worker = threading.Thread(target=train, name="trainer")
worker.start()
worker.join()
finish(sys.argv[1], result["losses"], result["model"])

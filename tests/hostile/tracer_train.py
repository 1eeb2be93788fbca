"""A training loop that installs threading.settrace / threading.setprofile hooks and starts a
thread of its own; prints the names of the threads its hooks ran in. memscope's threads must
not be among them (tests/test_hostile_agent.py)."""

import threading

traced: set[str] = set()
profiled: set[str] = set()


def tracer(frame, event, arg):
    traced.add(threading.current_thread().name)
    return None


def profiler(frame, event, arg):
    profiled.add(threading.current_thread().name)


threading.settrace(tracer)
threading.setprofile(profiler)

import torch  # noqa: E402 - after the hooks: memscope's agent starts with torch
import torch.nn as nn  # noqa: E402


def train(steps: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


worker = threading.Thread(target=train, args=(6,), name="user-worker")
worker.start()
worker.join()
threading.settrace(None)
threading.setprofile(None)
print("traced", sorted(traced))
print("profiled", sorted(profiled))
print("threads", sorted(t.name for t in threading.enumerate()))

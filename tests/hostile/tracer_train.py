"""A training loop that installs threading.settrace / threading.setprofile hooks before torch
(so before memscope's agent starts its threads), runs its first 4 steps on a worker thread and
the next 4 on the main thread, with no saved-tensors hooks of its own; prints the names of the
threads its hooks ran in (tests/test_hostile_agent.py)."""

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
threading.settrace(None)
threading.setprofile(None)
train(4)  # the loop goes on on the main thread
print("traced", sorted(traced))
print("profiled", sorted(profiled))
print("threads", sorted(t.name for t in threading.enumerate()))

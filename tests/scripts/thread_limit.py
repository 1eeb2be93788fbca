"""No new thread can start in this process once it has begun (tests/test_nothing_lost.py): run
as a user of its own (not root, whom the limit does not bind), it sets its RLIMIT_NPROC to the
number of tasks that user has now (the attach above it, itself), so the next thread any of them
starts fails: ``RuntimeError: can't start new thread`` - memscope's agent's first, which starts
right after ``import torch``. The training needs none (one compute thread): it trains 5 steps and
exits 0. Exits 4 when a thread can still start here (the limit did not take: run as root?)."""

import os
import resource
import sys
import threading


def tasks(uid: int) -> int:
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):  # not self, thread-self: counted once
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except (OSError, ValueError):
            continue
        if int(fields["Uid"].split()[0]) == uid:
            n += int(fields["Threads"])
    return n


resource.setrlimit(resource.RLIMIT_NPROC, (tasks(os.getuid()), resource.getrlimit(resource.RLIMIT_NPROC)[1]))
try:
    threading.Thread(target=lambda: None).start()
    sys.exit(4)
except RuntimeError:
    pass

import torch  # noqa: E402 - memscope's agent starts here (under attach), its thread cannot

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()

"""A CPU training on what may be a GPU machine: counts every question to the CUDA driver that
could initialise it (``torch.cuda.is_available``, ``device_count``, the raw device count). The
script itself asks none, so under attach any count is memscope's: on a GPU machine the first such
call initialises the CUDA runtime (CUDA then fails in the script's forked children)."""

import time

import torch
import torch.nn as nn

calls: list[str] = []


def counted(name, fn):
    def wrapper(*args, **kwargs):
        calls.append(name)
        return fn(*args, **kwargs)
    return wrapper


torch.cuda.is_available = counted("is_available", torch.cuda.is_available)
torch.cuda.device_count = counted("device_count", torch.cuda.device_count)
if hasattr(torch._C, "_cuda_getDeviceCount"):
    torch._C._cuda_getDeviceCount = counted("_cuda_getDeviceCount", torch._C._cuda_getDeviceCount)

model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
end = time.time() + 1.5  # past the agent's device rescan (1 s) at a sampling rate of 200 Hz
steps = 0
while time.time() < end or steps < 8:
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    steps += 1
    time.sleep(0.005)
print("cuda driver questions", sorted(set(calls)), len(calls))

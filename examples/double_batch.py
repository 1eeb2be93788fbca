"""Doubles its batch every step until the allocator refuses: the OOM of docs/oom.md."""
import torch
import torch.nn as nn

# One compute thread: each extra thread reserves its own stack and malloc arena (about 72 MiB of
# address space), so under `ulimit -v` the failing step would depend on the machine's core count.
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
batch = 1024
for step in range(30):
    x = torch.randn(batch, 32)
    y = torch.randint(0, 10, (batch,))
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    print("step", step, "batch", batch, flush=True)
    batch *= 2

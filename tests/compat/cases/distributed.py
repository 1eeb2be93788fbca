"""Two ranks on CPU with gloo, under torchrun: ``distributed.py OUT {ddp,fsdp2}``.

ddp    DistributedDataParallel
fsdp2  torch.distributed.fsdp.fully_shard on each Linear and the model (FSDP2)
Each rank saves OUT.rank<N>: its losses and its full parameters.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from _common import finish, seed

out, variant = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
seed()
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
if variant == "ddp":
    run = nn.parallel.DistributedDataParallel(model)
elif variant == "fsdp2":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    run = model
else:
    raise SystemExit(f"unknown variant {variant}")
opt = torch.optim.SGD(run.parameters(), lr=0.1, momentum=0.9)
torch.manual_seed(100 + rank)  # each rank its own data
losses = []
for step in range(8):
    x, y = torch.randn(16, 16), torch.randint(0, 4, (16,))
    loss = F.cross_entropy(run(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
if variant == "fsdp2":
    params = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
else:
    params = model
finish(f"{out}.rank{rank}", losses, params)
dist.destroy_process_group()

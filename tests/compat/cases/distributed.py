"""Two ranks on CPU with gloo, under torchrun: ``distributed.py OUT VARIANT [VARIANT ...]``, the
variants one after another in one process group (8 steps each, numbered on), each on a fresh
model: one torchrun start-up (and one import of torch per rank) for all of them.

ddp    DistributedDataParallel
fsdp2  torch.distributed.fsdp.fully_shard on each Linear and the model (FSDP2)
Each rank saves OUT.rank<N>: its losses and its full parameters (by variant when there are
several).
"""

import io
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from _common import finish, seed

out, variants = sys.argv[1], sys.argv[2:]
dist.init_process_group("gloo")
rank = dist.get_rank()


def train(variant: str) -> tuple[list[float], bytes]:
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
        params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # as bytes until the end: tensors kept from one variant to the next would be a leak
    saved = io.BytesIO()
    torch.save(params, saved)
    return losses, saved.getvalue()


def params_of(saved: bytes) -> Any:
    return torch.load(io.BytesIO(saved), weights_only=True)


results = {variant: train(variant) for variant in variants}
if len(variants) == 1:
    ((losses, saved),) = results.values()
    finish(f"{out}.rank{rank}", losses, params_of(saved))
else:
    finish(f"{out}.rank{rank}", [x for losses, _ in results.values() for x in losses],
           {v: params_of(saved) for v, (_, saved) in results.items()})
dist.destroy_process_group()

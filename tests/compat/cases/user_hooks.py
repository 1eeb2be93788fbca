"""The script's own hooks: forward pre/post hooks, a full backward hook, a global forward hook
and saved_tensors_hooks around the forward that pack to a copy: ``user_hooks.py OUT``."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import finish, seed

seed()
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
seen = {"pre": 0, "post": 0, "backward": 0, "global": 0, "packed": 0, "unpacked": 0}


def pre(module, args):
    seen["pre"] += 1
    return (args[0] * 1.0,)  # replaces the input: hooks that change values must keep working


def post(module, args, output):
    seen["post"] += 1
    return output + 0.0


def backward(module, grad_in, grad_out):
    seen["backward"] += 1


def global_hook(module, args, output):
    seen["global"] += 1


def pack(t):
    seen["packed"] += 1
    return t.clone()


def unpack(t):
    seen["unpacked"] += 1
    return t


model[0].register_forward_pre_hook(pre)
model[2].register_forward_hook(post)
model[4].register_full_backward_hook(backward)
handle = torch.nn.modules.module.register_module_forward_hook(global_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for step in range(8):
    x, y = torch.randn(16, 16), torch.randint(0, 4, (16,))
    if step % 2:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            loss = F.cross_entropy(model(x), y)
    else:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
handle.remove()
finish(sys.argv[1], losses, model, seen=seen)

"""Leak: the PyTorch FAQ's ``total_loss += loss``. Each step adds that step's autograd graph to
the chain behind ``total_loss`` (backward freed the saved activations, not the graph's nodes): a
few KiB a step, in one scalar tensor whose size never changes.

    memscope attach examples/leaks/total_loss.py && memscope leaks RUN.db

At default options it is reported by step 5, and by step 7 with its holder
(``__main__.train.<locals>.total_loss``) and the line that stores it.
"""

import torch
import torch.nn.functional as F

from _common import batch, model_for, parse


def train(args):
    model = model_for(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    total_loss = 0
    for step in range(args.steps):
        x, y = batch(args.batch, args.width)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total_loss += loss  # the leak: should be loss.item()
    return total_loss.item() / args.steps


if __name__ == "__main__":
    print(f"mean loss {train(parse(__doc__)):.3f}")

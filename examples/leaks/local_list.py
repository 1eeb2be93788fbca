"""Leak: a local list in the training function collects each step's logits (detached, but
never cleared): the holder is a variable of a running function, not a global.

    memscope attach examples/leaks/local_list.py && memscope leaks RUN.db

At default options it is reported by step 5, and by step 7 with its holder
(``__main__.train.<locals>.history``) and the line that stores it.
"""

import torch
import torch.nn.functional as F

from _common import batch, model_for, parse


def train(args):
    model = model_for(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    history = []  # the leak: grows by one [batch, 10] tensor per step
    for step in range(args.steps):
        x, y = batch(args.batch, args.width)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(logits.detach())
    return len(history)


if __name__ == "__main__":
    print(f"kept {train(parse(__doc__))} logit batches")

"""Leak: a forward hook caches every output of a layer in an attribute of that layer.

    memscope attach examples/leaks/hook_cache.py && memscope leaks RUN.db

At default options it is reported by step 5, and by step 7 with its holder
(``__main__.model.2.cache``) and the line that stores it.
"""

import torch
import torch.nn.functional as F

from _common import batch, model_for, parse


def remember_output(module, inputs, output):
    module.cache.append(output.detach())  # the leak: one tensor per forward, never cleared


if __name__ == "__main__":
    args = parse(__doc__)
    model = model_for(args.width)
    model[2].cache = []
    model[2].register_forward_hook(remember_output)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x, y = batch(args.batch, args.width)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"cached {len(model[2].cache)} outputs")

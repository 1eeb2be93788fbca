"""Leak: detached features appended to a module-level list every step (no graph, still a leak).

    memscope attach examples/leaks/detached_list.py && memscope leaks RUN.db

At default options it is reported by step 5, and by step 7 with its holder
(``__main__.features``) and the line that stores it.
"""

import torch
import torch.nn.functional as F

from _common import batch, model_for, parse

features = []  # the leak: grows by one [batch, width] tensor per step, never cleared

if __name__ == "__main__":
    args = parse(__doc__)
    model = model_for(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x, y = batch(args.batch, args.width)
        hidden = model[1](model[0](x))
        loss = F.cross_entropy(model[2:](hidden), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        features.append(hidden.detach())
    print(f"kept {len(features)} feature batches")

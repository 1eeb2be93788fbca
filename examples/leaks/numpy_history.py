"""Growth no tensor explains: each step's activations are copied to a numpy array and kept in a
list. The memory is host memory, not tensors: inventories see nothing grow, host RSS does.

    memscope attach examples/leaks/numpy_history.py && memscope leaks RUN.db

At default options "GROWTH host RSS ... that no tensor group explains" is reported with
"leaks: none" for the tensors: at the earliest from step 17 (the verdict needs 16 steps after
warm-up). 20-step runs beside two busy loops: 6 of 6 (2026-11-27; 3 of 4 before the first
quarter, the allocator warming up, was allowed to be the fastest).
"""

import torch
import torch.nn.functional as F

from _common import batch, model_for, parse

snapshots = []  # the leak: a numpy copy of each step's hidden activations (256 KiB a step)

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
        snapshots.append(hidden.detach().repeat(8, 1).numpy().copy())
    print(f"kept {len(snapshots)} snapshots")

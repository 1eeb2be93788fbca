"""No leak: lazy Adam state (created at the first step), an LR scheduler, evaluation every few
steps whose outputs are replaced, and a bounded buffer (deque(maxlen=5)) of detached tensors.

    memscope attach examples/leaks/healthy.py && memscope leaks RUN.db   # "leaks: none"
"""

import collections

import torch
import torch.nn.functional as F

from _common import batch, model_for, parse

recent = collections.deque(maxlen=5)  # bounded: fills during the first 5 steps, then plateaus
last_eval = None  # replaced at every evaluation

if __name__ == "__main__":
    args = parse(__doc__)
    model = model_for(args.width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # state appears lazily at step 0
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    x_val, y_val = batch(4 * args.batch, args.width)
    for step in range(args.steps):
        x, y = batch(args.batch, args.width)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        recent.append(logits.detach())
        if step % 4 == 3:
            with torch.no_grad():
                last_eval = model(x_val)  # an evaluation spike, gone at the next one
    print(f"final loss {loss.item():.3f}")

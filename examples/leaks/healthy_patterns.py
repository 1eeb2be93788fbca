"""No leak, though plenty grows and shrinks: what a leak checker must not call a leak.

* lazy Adam state (created at the first step) and an LR scheduler;
* gradient accumulation: each step's micro-batch losses in a list made anew every step;
* per-epoch metrics: predictions appended every step, cleared every 16 steps (whatever step the
  run ends on, the buffer may be nearly full);
* a list rebuilt at each "epoch" (10 steps);
* a cache that evicts (the last 8 entries, keyed by step) and a bounded deque(maxlen=5);
* warm-up growth: a buffer that fills during the first 10 steps, then stays;
* an evaluation every 7 steps whose outputs replace the previous ones.

    memscope attach examples/leaks/healthy_patterns.py --steps 45 && memscope leaks RUN.db  # none

A run shorter than a cycle cannot tell the metrics buffer (cleared every 16 steps) from a leak:
give it more than 16 steps (one clear) for a clean bill.
"""

import collections

import torch
import torch.nn.functional as F

from _common import batch, model_for, parse

ACCUM = 4  # micro-batches per optimizer step
recent = collections.deque(maxlen=5)
epoch_preds = []
cache = collections.OrderedDict()
warm = []
last_eval = None

if __name__ == "__main__":
    args = parse(__doc__)
    model = model_for(args.width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    x_val, _ = batch(4 * args.batch, args.width)
    for step in range(args.steps):
        if step % 10 == 0:
            epoch_losses = []
        micro = []
        for _ in range(ACCUM):
            x, y = batch(args.batch, args.width)
            logits = model(x)
            loss = F.cross_entropy(logits, y) / ACCUM
            loss.backward()
            micro.append(loss.detach())
        opt.step()
        opt.zero_grad()
        sched.step()
        epoch_losses.append(torch.stack(micro).sum())
        epoch_preds.append(logits.argmax(1))
        if len(epoch_preds) == 16:
            epoch_preds.clear()
        recent.append(logits.detach())
        cache[step] = logits.detach()[:4].clone()
        if len(cache) > 8:
            cache.popitem(last=False)
        if len(warm) < 10:
            warm.append(torch.zeros(8, 33))
        if step % 7 == 6:
            with torch.no_grad():
                last_eval = model(x_val)
    print(f"final loss {loss.item() * ACCUM:.3f}")

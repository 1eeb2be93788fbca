"""Leaks as real code makes them (issue 36), one per ``--leak``, in a small training loop whose
tensors are tiny (2,000 steps take a few seconds):

* ``traceback``: a check raises inside a helper that holds tensors; the loop keeps the exception
  (``errors.append(e)``): its ``__traceback__`` keeps the helper's frame, its locals and their
  graphs. ``--every N``: the check fails on every N-th step only, from step ``--from``;
  ``--chance P``: on such a step, when the batch says so, with probability P (its first value
  above the normal distribution's 1 - P quantile: the seeded data decides, the same steps every run).
* ``sometimes``: pytorch/examples' vae as issue 36 found it: a check on the model's output and
  hidden layer raises on the steps the batch decides (``--chance P``, default 0.35 for it), the
  loop keeps the exception; the output's and the helper's local's graphs share the hidden
  layer's, and backward has run on them (their nodes are kept, not their saved tensors).
* ``cache``: a ``functools.lru_cache(maxsize=None)`` function returns a new tensor for each new
  argument (the step).
* ``queue``: a ``queue.Queue`` fed each step; a logger thread takes one item every two steps (it
  follows the loop's step count, so the rate does not depend on timing; a full queue it drains
  at once). ``--timed``: the logger takes an item every 2 ms instead, whatever the loop does.
* ``hooks``: a forward hook registered inside the loop, each stashing a copy of the output.
* ``sparse``: a list keeping one sparse COO tensor a step (``--layout csr``: CSR), beside a
  sparse model that keeps nothing (an embedding with sparse gradients, a sparse adjacency).
* ``generator``: a generator's frame keeps each step's tensor in its local list.
* ``thread``: another thread's running function keeps the tensors handed to it in a local list.

Several (``--leak cache,queue``) run in one loop: the tensors of each have a shape of their own.
``--clean``: the same code without the leak (the message kept, not the exception; the cache
bounded; the queue drained in time; the hook registered once; the sparse tensor replaced each
step; the generator's and the thread's lists bounded), and an evaluation under
``torch.no_grad()`` every 10 steps.
"""

from __future__ import annotations

import argparse
import functools
import queue
from statistics import NormalDist
import threading
import time
from collections import deque

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--leak", default="traceback",
               help="traceback, cache, queue, hooks, sparse, generator, thread, or several, comma-separated")
p.add_argument("--clean", action="store_true")
p.add_argument("--every", type=int, default=1)
p.add_argument("--chance", type=float, default=None)
p.add_argument("--from", dest="start", type=int, default=0)
p.add_argument("--timed", action="store_true")
p.add_argument("--layout", default="coo", choices=["coo", "csr"])
args = p.parse_args()

WIDTH = 16
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
errors = []
rare_errors = []


def check(h, fails):
    scaled = h * 3.0  # a local of the helper's frame, with its graph
    if fails:
        raise ValueError("activation out of range")  # built-in: takes no weak reference
    return scaled


def check_output(out, hidden, fails):
    scaled = hidden * 2.0  # a local of the helper that raises: its traceback keeps it
    if fails:
        raise ValueError("output out of range")
    return scaled


def forward_wide(x):
    """The model on a batch of 10 rows made of ``x`` (shapes of their own), its hidden layer, and
    a loss of both whose backward frees what their graphs saved."""
    hidden = model[1](model[0](torch.cat([x, x[:2]])))
    out = model[2](hidden)
    (out.square().mean() + hidden.mean()).backward()
    return out, hidden


@functools.lru_cache(maxsize=None)
def position_table(step):
    return torch.full((5, WIDTH), float(step))  # a new tensor for each new argument


@functools.lru_cache(maxsize=4)
def bounded_table(step):
    return torch.full((5, WIDTH), float(step))


log_queue = queue.Queue()
progress = threading.Condition()
done_steps = [0, 0]  # steps the loop finished, items the logger took


def may_take() -> bool:
    """The logger takes item n once the loop finished step 2n (n with --clean), or whenever the
    queue is full, or every 2 ms (--timed)."""
    return args.timed or log_queue.full() or done_steps[1] * (1 if args.clean else 2) <= done_steps[0]


def logger():
    while True:
        with progress:
            if not progress.wait_for(may_take, timeout=0.05):
                continue
        log_queue.get()
        with progress:
            done_steps[1] += 1
            progress.notify_all()
        if args.timed:
            time.sleep(0.002)


def logged(step):
    """The loop waits for the logger to take what it may take by now (a deterministic rate)."""
    with progress:
        done_steps[0] = step
        progress.notify_all()
        # a loaded machine can leave the logger unscheduled for over a second: the rate must
        # not depend on it
        progress.wait_for(lambda: args.timed or log_queue.full()
                          or done_steps[1] * (1 if args.clean else 2) > step, timeout=60.0)


def stash(module, inputs, output):
    module.seen.append(output.detach().clone())


def windows():
    kept = []
    while True:
        t = yield
        kept.append(t)
        if args.clean:
            del kept[:-2]


handed = []
handed_ready = threading.Semaphore(0)
owner_took = threading.Semaphore(0)


def owner():
    mine = []  # a local of this thread's running function
    while True:
        handed_ready.acquire()
        mine.append(handed.pop())
        if args.clean:
            del mine[:-2]
        owner_took.release()


def batch():
    return torch.randn(8, WIDTH), torch.randint(0, 4, (8,))


SPARSE_MODEL = "sparse" in args.leak.split(",")
if SPARSE_MODEL:  # a sparse model too: an embedding with sparse gradients, and a sparse adjacency
    emb = nn.Embedding(64, 4, sparse=True)
    opt.add_param_group({"params": emb.parameters()})
    ring = torch.arange(WIDTH)
    adjacency = torch.sparse_coo_tensor(torch.stack([ring, (ring + 1) % WIDTH]), torch.ones(WIDTH),
                                        (WIDTH, WIDTH), check_invariants=True).coalesce()


def train_step():
    x, y = batch()
    if SPARSE_MODEL:
        x = torch.sparse.mm(adjacency, x.t()).t().contiguous()
    h = model[0](x)
    loss = F.cross_entropy(model[2](model[1](h)), y)
    if SPARSE_MODEL:
        loss = loss + emb(torch.randint(0, 64, (8,))).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return x, h


# each leak: (set-up, what it does after each step); the tensors of each have a shape of their own
CHANCE = args.chance if args.chance is not None else (0.35 if "sometimes" in args.leak.split(",") else 1.0)
CUT = NormalDist().inv_cdf(1 - CHANCE) if 0 < CHANCE < 1 else None  # x ~ N(0, 1)


def data_says(x):
    return CHANCE > 0 and (CUT is None or float(x[0, 0]) > CUT)  # the data decides


def cache_step(step, x, h):
    if args.clean:
        bounded_table(step)
    else:
        position_table(step)


def queue_setup():
    threading.Thread(target=logger, name="logger", daemon=True).start()


def queue_step(step, x, h):
    log_queue.put(h.detach()[:6].clone())
    logged(step)


def hooks_setup():
    model[1].seen = deque(maxlen=2) if args.clean else []
    if args.clean:
        model[1].register_forward_hook(stash)


def sparse_step(step, x, h, kept=[]):  # noqa: B006 - the list the leak keeps
    idx = torch.tensor([[step % WIDTH, 1], [2, 3]])
    s = torch.sparse_coo_tensor(idx, torch.ones(2), (WIDTH, WIDTH), check_invariants=True).coalesce()
    if args.layout == "csr":
        s = s.to_sparse_csr()
    if args.clean:
        kept[:] = [s]
    else:
        kept.append(s)


feed = windows()


def generator_setup():
    next(feed)


def generator_step(step, x, h):
    feed.send(h.detach()[:7].clone())


def thread_setup():
    threading.Thread(target=owner, name="owner", daemon=True).start()


def thread_step(step, x, h):
    handed.append(torch.cat([h.detach(), h.detach()[:1]]))
    handed_ready.release()
    owner_took.acquire()


def train(steps, leaks):
    for name in leaks:
        setup = globals().get(f"{name}_setup")
        if setup is not None:
            setup()
    per_step = [globals()[f"{name}_step"] for name in leaks if f"{name}_step" in globals()]
    hook_every_step = "hooks" in leaks and not args.clean
    for step in range(steps):
        if hook_every_step:
            model[1].register_forward_hook(stash)  # one more each step
        x, h = train_step()
        if "traceback" in leaks:  # caught in the loop's own frame (a running frame in each traceback)
            fails = step >= args.start and step % args.every == 0 and data_says(x)
            try:
                check(model[0](x), fails)
            except ValueError as e:
                if args.clean:
                    errors.append(str(e))
                else:
                    errors.append(e)
        if "sometimes" in leaks:  # the check raises on the steps the data decides
            out, hidden = forward_wide(x)
            try:
                check_output(out, hidden, not args.clean and data_says(x))
            except ValueError as e:
                rare_errors.append(e)
        for fn in per_step:
            fn(step, x, h)
        if args.clean and step % 10 == 0:
            with torch.no_grad():
                model(torch.randn(32, WIDTH))


train(args.steps, args.leak.split(","))
print(f"done: {len(errors)} errors kept")

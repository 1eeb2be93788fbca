"""A training that evaluates: every --eval-every steps the model goes to eval mode and runs
--eval-batches batches under no_grad (long enough to be seen by the sampler: about --eval-s
seconds), then back to train mode. Prints the wall-clock span of each evaluation as
"EVAL <start> <end> <step>" (time.time()), for tests to compare the run file's marks with."""

import argparse
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--eval-every", type=int, default=10)
p.add_argument("--eval-s", type=float, default=0.5)
p.add_argument("--train-in-eval", action="store_true", help="train in eval mode throughout (frozen batch norm style)")
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if args.train_in_eval:
    model.eval()
for step in range(args.steps):
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if (step + 1) % args.eval_every == 0:
        start = time.time()
        model.eval()
        with torch.no_grad():
            while time.time() - start < args.eval_s:
                model(torch.randn(256, 64)).argmax(1)
        model.train(not args.train_in_eval)
        print(f"EVAL {start:.6f} {time.time():.6f} {step}", flush=True)

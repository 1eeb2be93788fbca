"""A training loop with a classic leak: the loss tensor (and its whole autograd graph, with the
activations it saved) is kept in a list every step.

    memscope attach examples/leaky.py --steps 40 && memscope leaks RUN.db

At default options the leak (about 390 KiB a step) is reported by step 5 and with its holder
(``__main__.loss_history``) and the line that stores it (``examples/leaky.py:39``) by step 7.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

loss_history = []  # the leak: should hold loss.item(), holds the graph


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    args = p.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(args.steps):
        x = torch.randn(args.batch, args.width)
        y = torch.randint(0, 10, (args.batch,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward(retain_graph=True)
        opt.step()
        loss_history.append(loss)  # keeps every step's graph alive
    print(f"mean loss {torch.stack(loss_history).mean().item():.3f}")


if __name__ == "__main__":
    main()

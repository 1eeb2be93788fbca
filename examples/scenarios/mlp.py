"""A deep fp32 MLP on synthetic data: a run dominated by activations (a big batch through narrow
layers), for the suggestion scenarios.

    memscope attach examples/scenarios/mlp.py                     # fp32, plain SGD
    memscope attach examples/scenarios/mlp.py --dtype bf16        # the whole model in bf16
    memscope attach examples/scenarios/mlp.py --dtype fp64        # the whole model in float64
    memscope attach examples/scenarios/mlp.py --optimizer lbfgs   # a closure the optimizer evaluates
    memscope attach examples/scenarios/mlp.py --oom-at-step 4     # a memory-bound OOM at step 4
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn


class Widen(nn.Module):
    """Repeats its input ``factor`` times along the batch (factor 1: identity). Raising the
    factor mid-run stands for a batch that grew: a real allocation far above what fits."""

    def __init__(self) -> None:
        super().__init__()
        self.factor = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.factor == 1 else x.repeat(self.factor, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=8, help="Linear + ReLU pairs")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp64"], default="fp32")
    p.add_argument("--optimizer", choices=["sgd", "adam", "lbfgs"], default="sgd")
    p.add_argument("--lbfgs-iter", type=int, default=20, help="LBFGS's max_iter: closure calls per step")
    p.add_argument("--oom-at-step", type=int, default=-1,
                   help="from this step on, ask for about --oom-gb GB of activations")
    p.add_argument("--oom-gb", type=float, default=400.0)
    args = p.parse_args()

    torch.manual_seed(0)
    layers: list[nn.Module] = [Widen()]
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    layers.append(nn.Linear(args.width, 1))
    model = nn.Sequential(*layers)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}[args.dtype]
    model.to(dtype)
    opt: torch.optim.Optimizer
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    elif args.optimizer == "lbfgs":  # re-evaluates the loss through a closure inside step()
        opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=args.lbfgs_iter)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        if step == args.oom_at_step:
            row = args.width * torch.finfo(dtype).bits // 8
            model[0].factor = max(2, int(args.oom_gb * 1e9 / (args.batch * row)))
        x = torch.randn(args.batch, args.width, dtype=dtype)

        def closure(x: torch.Tensor = x) -> torch.Tensor:
            loss = model(x).float().pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            return loss

        if args.optimizer == "lbfgs":
            opt.step(closure)
        else:
            closure()
            opt.step()


if __name__ == "__main__":
    main()

"""A real training script whose module names, class names and a leak's holder come from the
hostile corpus (tests/test_hostile_corpus.py). The trap directory is argv[1]."""

import sys

import torch
import torch.nn as nn

from corpus import corpus

NAMES = corpus(sys.argv[1])


def leaf_class(name: str) -> type:
    # a class name may hold anything but NUL (type() refuses it)
    return type(name.replace("\x00", "0"), (nn.Linear,), {})


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.body = nn.Module()  # a parent: dotted names such as body.<hostile name>
        for label, name in NAMES.items():
            # add_module refuses "." and "": a name from a vocabulary would be cleaned the same way
            self.body.add_module(name.replace(".", "_"), leaf_class(NAMES[label])(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for m in self.body.children():
            x = torch.tanh(m(x))
        return x


torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept: list[torch.Tensor] = []
globals()["FEATURES" + NAMES["osc0_title"]] = kept  # a holder whose name is hostile
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 14):
    out = model(torch.randn(4, 8))
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    kept.append(torch.randn(3, 71))  # a leak of its own shape, held by the hostile global
print("done")

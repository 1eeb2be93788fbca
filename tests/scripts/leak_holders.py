"""Eight leaks, one per kind of holder, each a tensor of its own shape added every step
(tests/test_leak_holders.py): what keeps them alive must be named as a person would write it."""

import functools
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import leakmod  # a module of the script's own, with a global list


def make_probe():
    seen = []

    def probe(t):
        seen.append(t)  # a closure cell
    return probe


def log(t, _cache={}):  # noqa: B006 - a default argument: the leak under test
    _cache[len(_cache)] = t


def log_kw(t, *, store=[]):  # noqa: B006 - a keyword-only default: the leak under test
    store.append(t)


def _append(box, t):
    box.append(t)


record = functools.partial(_append, [])  # a partial's bound argument


class Recorder:
    def __init__(self):
        self.items = []

    def add(self, t):
        self.items.append(t)


class Tracker:
    def __init__(self):
        self.history = []


probe = make_probe()
callbacks = [Recorder().add]  # a bound method: the instance is reached through it only
tracker = Tracker()  # an instance attribute
per_param = {}  # a dict keyed by a parameter, as opt.state is


def train(steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 64)
        loss = F.cross_entropy(model(x), torch.randint(0, 10, (16,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        probe(torch.zeros(4, 101))
        log(torch.zeros(4, 102))
        log_kw(torch.zeros(4, 103))
        record(torch.zeros(4, 104))
        callbacks[0](torch.zeros(4, 105))
        tracker.history.append(torch.zeros(4, 106))
        leakmod.keep(torch.zeros(4, 107))
        per_param.setdefault(model[0].weight, []).append(torch.zeros(4, 108))
        losses.append(loss)  # the loss tensor (and its graph's nodes), not loss.item()


if __name__ == "__main__":
    train(int(sys.argv[1]) if len(sys.argv) > 1 else 12)

"""A tiny character-level GPT trained the way karpathy's ng-video-lecture, makemore and minGPT
train theirs (loss computed inside ``forward``, an evaluation every N steps, a callback after each
step), with one of the leaks users inject or write by accident (``--leak``):

* ``cache``: ``cache[it] = logits`` (the whole graph kept per step)
* ``history``: ``history.append(loss)``, the loss made inside ``model.forward``
* ``callback``: a callback keeps ``trainer.loss`` in a list (minGPT's trainer/callback pattern)
* ``eval``: an evaluation without ``torch.no_grad()`` appends its logits to a module global
* ``total``: ``total_loss += loss`` after ``backward()`` (graph nodes, no tensor bytes)
* ``none``: the clean run
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--leak", default="none", choices=["none", "cache", "history", "callback", "eval", "total"])
p.add_argument("--eval-every", type=int, default=30)
args = p.parse_args()

VOCAB, BLOCK, EMBD, HEADS, LAYERS, BATCH = 32, 16, 32, 2, 2, 8
torch.manual_seed(0)
data = torch.randint(0, VOCAB, (20_000,))
eval_outputs = []  # the eval leak's list: a plain module global


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - BLOCK, (BATCH,))
    x = torch.stack([data[i:i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1:i + BLOCK + 1] for i in ix])
    return x, y


class Head(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.key = nn.Linear(EMBD, size, bias=False)
        self.query = nn.Linear(EMBD, size, bias=False)
        self.value = nn.Linear(EMBD, size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(BLOCK, BLOCK)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        k, q, v = self.key(x), self.query(x), self.value(x)
        w = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        w = F.softmax(w.masked_fill(self.tril[:T, :T] == 0, float("-inf")), dim=-1)
        return w @ v


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList(Head(EMBD // HEADS) for _ in range(HEADS))
        self.proj = nn.Linear(EMBD, EMBD)
        self.ffwd = nn.Sequential(nn.Linear(EMBD, 4 * EMBD), nn.ReLU(), nn.Linear(4 * EMBD, EMBD))
        self.ln1, self.ln2 = nn.LayerNorm(EMBD), nn.LayerNorm(EMBD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.proj(torch.cat([head(h) for head in self.heads], dim=-1))
        return x + self.ffwd(self.ln2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, EMBD)
        self.pos = nn.Embedding(BLOCK, EMBD)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.head = nn.Linear(EMBD, VOCAB)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        logits = self.head(self.blocks(x))
        loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
        return logits, loss


class Trainer:
    """A minimal trainer with callbacks, as minGPT's."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.callbacks: list = []
        self.loss: torch.Tensor | None = None

    def run(self, steps: int) -> None:
        total_loss = 0
        cache = {}
        history = []
        for it in range(steps):
            if it % args.eval_every == 0:
                evaluate(self.model)
            x, y = get_batch()
            logits, self.loss = self.model(x, y)
            self.opt.zero_grad(set_to_none=True)
            self.loss.backward()
            self.opt.step()
            if args.leak == "cache":
                cache[it] = logits
            elif args.leak == "history":
                history.append(self.loss)
            elif args.leak == "total":
                total_loss += self.loss
            for cb in self.callbacks:
                cb(self)


def evaluate(model: nn.Module) -> None:
    if args.leak == "eval":  # no torch.no_grad(): the outputs keep their graphs
        x, y = get_batch()
        logits, _ = model(x, y)
        eval_outputs.append(logits)
    else:
        with torch.no_grad():
            model(*get_batch())


kept_losses = []


def keep_loss(trainer: Trainer) -> None:
    kept_losses.append(trainer.loss)


trainer = Trainer(GPT())
if args.leak == "callback":
    trainer.callbacks.append(keep_loss)
trainer.run(args.steps)

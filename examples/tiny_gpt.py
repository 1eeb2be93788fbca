"""A small GPT-like model trained on synthetic tokens: the healthy example.

    python examples/tiny_gpt.py --steps 30
    memscope attach examples/tiny_gpt.py --steps 30
    memscope attach examples/tiny_gpt.py --steps 30 --checkpoint   # activation checkpointing
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


class NaiveAttention(nn.Module):
    """Attention that materialises the N x N score matrix (what efficient attention avoids)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_heads)
        mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        attn = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = NaiveAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, seq: int,
                 checkpoint: bool = False) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            if self.checkpoint and torch.is_grad_enabled():
                # keep only each block's input; recompute its activations in backward
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.ln_f(x))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--eval-every", type=int, default=10, help="no_grad evaluation cadence (0: never)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing on each block (recompute in backward)")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    model = TinyGPT(args.vocab, args.d_model, args.heads, args.layers, args.seq, args.checkpoint)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(args.steps):
        idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if args.eval_every and (step + 1) % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                val = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
                val_loss = F.cross_entropy(model(val[:, :-1]).reshape(-1, args.vocab), val[:, 1:].reshape(-1))
            model.train()
            print(f"step {step + 1}: loss {loss.item():.3f} val {val_loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()

"""examples/tiny_gpt.py's model, optionally with its attention computed by
``scaled_dot_product_attention`` (never storing the N x N scores): the same run with and
without the efficient-attention change.

    memscope attach examples/scenarios/gpt.py --seq 256
    memscope attach examples/scenarios/gpt.py --seq 256 --sdpa
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tiny_gpt import NaiveAttention, TinyGPT  # noqa: E402


def sdpa_forward(self: NaiveAttention, x: torch.Tensor) -> torch.Tensor:
    b, n, d = x.shape
    q, k, v = self.qkv(x).view(b, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.proj(y.transpose(1, 2).reshape(b, n, d))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--sdpa", action="store_true", help="attention by scaled_dot_product_attention")
    args = p.parse_args()
    if args.sdpa:
        NaiveAttention.forward = sdpa_forward  # type: ignore[method-assign]

    torch.manual_seed(0)
    model = TinyGPT(args.vocab, args.d_model, args.heads, args.layers, args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(args.steps):
        idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()

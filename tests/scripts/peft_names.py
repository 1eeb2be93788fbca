"""A tiny LoRA GPT whose modules nest as peft names them, in plain torch:
``base_model.model.transformer.h.0.attn.c_attn.lora_A.default`` (the dashboard's long-name case).

    memscope attach tests/scripts/peft_names.py --steps 6 [--leak] [--oom-step N]

--leak keeps every step's loss (and its graph); --oom-step N makes the innermost LoRA layer of
the last block ask for about 3 PB at step N, a real allocator failure in a long-named module.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, VOCAB, BLOCKS, RANK = 64, 96, 2, 4
kept: list[torch.Tensor] = []  # --leak: every step's loss, with its graph


class LoraLinear(nn.Module):
    """peft's lora.Linear: a frozen base layer plus ``lora_A.default`` / ``lora_B.default``."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.base_layer = nn.Linear(n_in, n_out)
        self.base_layer.requires_grad_(False)
        self.lora_A = nn.ModuleDict({"default": nn.Linear(n_in, RANK, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(RANK, n_out, bias=False)})
        self.lora_dropout = nn.ModuleDict({"default": nn.Dropout(0.1)})
        self.huge = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.huge:  # 64 x 2**48 float32 is about 3 PB: no machine has it
            x.new_empty(x.shape[0], 2**48)
        a = self.lora_A["default"](self.lora_dropout["default"](x))
        return self.base_layer(x) + self.lora_B["default"](a)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.attn = nn.ModuleDict({"c_attn": LoraLinear(WIDTH, 3 * WIDTH), "c_proj": LoraLinear(WIDTH, WIDTH)})
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.ModuleDict({"c_fc": LoraLinear(WIDTH, 4 * WIDTH), "c_proj": LoraLinear(4 * WIDTH, WIDTH)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn["c_attn"](self.ln_1(x)).split(WIDTH, dim=-1)
        att = torch.softmax(q @ k.transpose(-2, -1) / WIDTH ** 0.5, dim=-1)
        x = x + self.attn["c_proj"](att @ v)
        return x + self.mlp["c_proj"](F.gelu(self.mlp["c_fc"](self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict({"wte": nn.Embedding(VOCAB, WIDTH),
                                          "h": nn.ModuleList(Block() for _ in range(BLOCKS)),
                                          "ln_f": nn.LayerNorm(WIDTH)})
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.transformer["wte"](idx)
        for block in self.transformer["h"]:
            x = block(x)
        return self.lm_head(self.transformer["ln_f"](x))


class PeftModel(nn.Module):
    """``base_model.model``: the wrapping peft adds in front of every name."""

    def __init__(self) -> None:
        super().__init__()
        self.base_model = nn.Module()
        self.base_model.model = GPT()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.base_model.model(idx)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--leak", action="store_true")
    p.add_argument("--oom-step", type=int, default=-1)
    args = p.parse_args()

    torch.manual_seed(0)
    model = PeftModel()
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-3)
    for step in range(args.steps):
        if step == args.oom_step:
            model.base_model.model.transformer["h"][-1].mlp["c_proj"].huge = True
        idx = torch.randint(0, VOCAB, (8, 32))
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, VOCAB), idx.view(-1))
        opt.zero_grad()
        loss.backward(retain_graph=args.leak)
        opt.step()
        if args.leak:
            kept.append(loss)
    print(f"done {args.steps} steps")


if __name__ == "__main__":
    main()

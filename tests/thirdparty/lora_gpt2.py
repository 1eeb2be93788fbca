"""A peft LoRA loop on a tiny GPT-2 built from a config (nothing downloaded): `get_peft_model`
with rank-8 adapters on `c_attn`, the base frozen, AdamW over the adapters, the loss computed by
the HF model from `labels=` (it upcasts the logits to float32), a plain PyTorch loop. Falls back
to plain-torch LoRA adapters (frozen base, trainable low-rank A/B) when peft is not installed."""
import sys

import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
base = GPT2LMHeadModel(GPT2Config(vocab_size=8000, n_positions=64, n_embd=128, n_layer=2, n_head=4))
try:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"], lora_dropout=0.05,
                                            fan_in_fan_out=True))
except ImportError:  # the same pattern without peft
    class LoRA(nn.Module):
        def __init__(self, inner, r=8):
            super().__init__()
            self.inner = inner
            n_in, n_out = inner.weight.shape  # GPT-2's Conv1D stores (in, out)
            self.lora_A = nn.Linear(n_in, r, bias=False)
            self.lora_B = nn.Linear(r, n_out, bias=False)
            nn.init.zeros_(self.lora_B.weight)

        def forward(self, x):
            return self.inner(x) + self.lora_B(self.lora_A(x)) * 2.0

    for p in base.parameters():
        p.requires_grad_(False)
    for block in base.transformer.h:
        block.attn.c_attn = LoRA(block.attn.c_attn)
    model = base
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
model.train()
tokens = torch.randint(0, 8000, (512, 64))
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
# argv: [steps] [--batch N] [--accumulate K]: K micro-batches of N per optimizer step
BATCH = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 16
ACCUMULATE = int(sys.argv[sys.argv.index("--accumulate") + 1]) if "--accumulate" in sys.argv else 1
for step in range(steps):
    for _ in range(ACCUMULATE):
        batch = tokens[torch.randint(0, len(tokens), (BATCH,))]
        loss = model(input_ids=batch, labels=batch).loss
        (loss / ACCUMULATE if ACCUMULATE > 1 else loss).backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")

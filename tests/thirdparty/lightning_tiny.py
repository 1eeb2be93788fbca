"""A tiny Lightning run: a LightningModule holding a small causal transformer (explicit attention,
GELU MLP, LayerNorm, blocks in a ModuleList), AdamW from configure_optimizers, trained by
`Trainer(accelerator="cpu")` on random tokens; no checkpoints or logs written.
`lightning_tiny.py STEPS sdpa` runs the attention through scaled_dot_product_attention."""
import math
import sys

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK, WIDTH, HEADS, LAYERS = 512, 64, 96, 4, 3
# argv: [steps] [sdpa] [--batch N] [--accumulate K]: K micro-batches of N per optimizer step
SDPA = sys.argv[2:3] == ["sdpa"]
BATCH = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 32
ACCUMULATE = int(sys.argv[sys.argv.index("--accumulate") + 1]) if "--accumulate" in sys.argv else 1


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("mask", torch.tril(torch.ones(BLOCK, BLOCK)).bool())

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        if SDPA:  # the efficient_attention suggestion applied
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(c // HEADS)
            att = F.softmax(att.masked_fill(~self.mask[:t, :t], float("-inf")), dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x):
        h = self.wte(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))

    def training_step(self, batch, _):
        x, y = batch
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


torch.manual_seed(0)
data = torch.randint(0, VOCAB, (1024, BLOCK + 1))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:]), batch_size=BATCH)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
L.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=ACCUMULATE, logger=False,
          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(TinyLM(), loader)

"""karpathy/makemore's Transformer (makemore.py): explicit causal attention (q @ k^T, masked_fill,
softmax, @ v, no dropout), NewGELU MLP in a ModuleDict, LayerNorm, the loss computed inside the
model's forward, AdamW(betas=(0.9, 0.99), weight_decay=0.01). Names are ~16 characters of a
27-letter vocabulary; the batch is larger than makemore's 32 so the activations are MiBs.
`makemore_transformer.py STEPS sdpa` runs the attention through scaled_dot_product_attention."""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK, N_EMBD, N_HEAD, N_LAYER = 27, 16, 64, 4, 4
# argv: [steps] [sdpa] [--batch N] [--accumulate K]: K micro-batches of N per optimizer step
SDPA = sys.argv[2:3] == ["sdpa"]
BATCH = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 512
ACCUMULATE = int(sys.argv[sys.argv.index("--accumulate") + 1]) if "--accumulate" in sys.argv else 1


class NewGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK)).view(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        k, q, v = (z.view(b, t, N_HEAD, c // N_HEAD).transpose(1, 2) for z in (k, q, v))
        if SDPA:  # the efficient_attention suggestion applied
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(N_EMBD)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(N_EMBD)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(N_EMBD, 4 * N_EMBD), c_proj=nn.Linear(4 * N_EMBD, N_EMBD),
                                      act=NewGELU()))

    def forward(self, x):
        m = self.mlp
        x = x + self.attn(self.ln_1(x))
        return x + m.c_proj(m.act(m.c_fc(self.ln_2(x))))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(VOCAB, N_EMBD), wpe=nn.Embedding(BLOCK, N_EMBD),
                                              h=nn.ModuleList([Block() for _ in range(N_LAYER)]),
                                              ln_f=nn.LayerNorm(N_EMBD)))
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long).unsqueeze(0)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


torch.manual_seed(3407)
model = Transformer()
opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01, betas=(0.9, 0.99), eps=1e-8)
words = torch.randint(1, VOCAB, (4096, BLOCK + 1))  # the dataset stays on the CPU
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
for step in range(steps):
    for micro in range(ACCUMULATE):
        ix = torch.randint(0, len(words), (BATCH,))
        x, y = words[ix, :-1], words[ix, 1:]
        logits, loss = model(x, y)
        if micro == 0:
            model.zero_grad(set_to_none=True)
        (loss / ACCUMULATE if ACCUMULATE > 1 else loss).backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} | loss {loss.item():.4f}")

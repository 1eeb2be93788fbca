"""karpathy/minGPT's chargpt (mingpt/model.py, projects/chargpt): explicit causal attention with
attention dropout (attn_pdrop) and residual dropout 0.1, NewGELU MLP, LayerNorm, the loss inside
the model's forward, AdamW over decayed / undecayed parameter groups, grad-norm clipping and a
checkpoint `torch.save`d during training (to a temporary directory here). gpt-mini shrunk.
`mingpt_chargpt.py STEPS sdpa` runs the attention through scaled_dot_product_attention."""
import math
import os
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK, N_EMBD, N_HEAD, N_LAYER, PDROP = 65, 64, 96, 6, 3, 0.1
# argv: [steps] [sdpa] [--batch N] [--accumulate K]: K micro-batches of N per optimizer step
SDPA = sys.argv[2:3] == ["sdpa"]
BATCH = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 32
ACCUMULATE = int(sys.argv[sys.argv.index("--accumulate") + 1]) if "--accumulate" in sys.argv else 1


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)
        self.attn_dropout = nn.Dropout(PDROP)
        self.resid_dropout = nn.Dropout(PDROP)
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK)).view(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        k, q, v = (z.view(b, t, N_HEAD, c // N_HEAD).transpose(1, 2) for z in (k, q, v))
        if SDPA:  # the efficient_attention suggestion applied (minGPT's own flash path in nanoGPT)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=PDROP if self.training else 0.0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class NewGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(N_EMBD)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(N_EMBD)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(N_EMBD, 4 * N_EMBD), c_proj=nn.Linear(4 * N_EMBD, N_EMBD),
                                      act=NewGELU(), dropout=nn.Dropout(PDROP)))

    def forward(self, x):
        m = self.mlp
        x = x + self.attn(self.ln_1(x))
        return x + m.dropout(m.c_proj(m.act(m.c_fc(self.ln_2(x)))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, N_EMBD), wpe=nn.Embedding(BLOCK, N_EMBD), drop=nn.Dropout(PDROP),
            h=nn.ModuleList([Block() for _ in range(N_LAYER)]), ln_f=nn.LayerNorm(N_EMBD)))
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(0, idx.size(1), dtype=torch.long).unsqueeze(0)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


torch.manual_seed(3407)
model = GPT()
decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=5e-4, betas=(0.9, 0.95))
text = torch.randint(0, VOCAB, (50_000,))  # the character dataset, on the CPU
out = tempfile.mkdtemp(prefix="chargpt-")
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
for it in range(steps):
    for micro in range(ACCUMULATE):
        ix = torch.randint(0, len(text) - BLOCK - 1, (BATCH,))
        x = torch.stack([text[i:i + BLOCK] for i in ix])
        y = torch.stack([text[i + 1:i + BLOCK + 1] for i in ix])
        logits, loss = model(x, y)
        if micro == 0:
            model.zero_grad(set_to_none=True)
        (loss / ACCUMULATE if ACCUMULATE > 1 else loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if it % 5 == 0:
        print(f"iter {it}: train loss {loss.item():.5f}")
        torch.save(model.state_dict(), os.path.join(out, "model.pt"))

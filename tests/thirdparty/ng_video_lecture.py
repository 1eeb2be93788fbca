"""karpathy/ng-video-lecture's gpt.py: one `Head` module per attention head (key / query / value
Linear without bias, a `tril` buffer, `wei = q @ k^T * C**-0.5`, masked_fill, softmax, attention
dropout 0.2, @ v), MultiHeadAttention concatenating the heads, a Sequential feed-forward with
dropout, Blocks in an nn.Sequential, the loss inside the forward, AdamW, a CPU dataset tensor and
`f"{losses['train']:.4f}"` reporting. Shrunk from 384 wide x 6 layers x 256 tokens.
`ng_video_lecture.py STEPS sdpa` runs each head through scaled_dot_product_attention."""
import sys

import torch
import torch.nn as nn
from torch.nn import functional as F

block_size, n_embd, n_head, n_layer, dropout, vocab_size = 64, 96, 4, 3, 0.2, 65
# argv: [steps] [sdpa] [--batch N] [--accumulate K]: K micro-batches of N per optimizer step
SDPA = sys.argv[2:3] == ["sdpa"]
batch_size = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 32
ACCUMULATE = int(sys.argv[sys.argv.index("--accumulate") + 1]) if "--accumulate" in sys.argv else 1


class Head(nn.Module):
    def __init__(self, head_size):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        k, q = self.key(x), self.query(x)
        if SDPA:  # the efficient_attention suggestion applied (same scale, mask and dropout)
            return F.scaled_dot_product_attention(q, k, self.value(x), dropout_p=dropout if self.training else 0.0,
                                                  is_causal=True, scale=C**-0.5)
        wei = q @ k.transpose(-2, -1) * C**-0.5
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        wei = self.dropout(F.softmax(wei, dim=-1))
        return wei @ self.value(x)


class MultiHeadAttention(nn.Module):
    def __init__(self, num_heads, head_size):
        super().__init__()
        self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.proj(torch.cat([h(x) for h in self.heads], dim=-1)))


class FeedFoward(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.ReLU(), nn.Linear(4 * n_embd, n_embd),
                                 nn.Dropout(dropout))

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.sa = MultiHeadAttention(n_head, n_embd // n_head)
        self.ffwd = FeedFoward(n_embd)
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        return x + self.ffwd(self.ln2(x))


class GPTLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.token_embedding_table = nn.Embedding(vocab_size, n_embd)
        self.position_embedding_table = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head=n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.token_embedding_table(idx) + self.position_embedding_table(torch.arange(T))
        logits = self.lm_head(self.ln_f(self.blocks(x)))
        if targets is None:
            return logits, None
        B, T, C = logits.shape
        logits = logits.view(B * T, C)
        return logits, F.cross_entropy(logits, targets.view(B * T))


torch.manual_seed(1337)
data = torch.randint(0, vocab_size, (200_000,))  # the encoded text: a CPU tensor by design
model = GPTLanguageModel()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
for it in range(steps):
    for micro in range(ACCUMULATE):
        ix = torch.randint(len(data) - block_size, (batch_size,))
        xb = torch.stack([data[i:i + block_size] for i in ix])
        yb = torch.stack([data[i + 1:i + block_size + 1] for i in ix])
        logits, loss = model(xb, yb)
        if micro == 0:
            optimizer.zero_grad(set_to_none=True)
        (loss / ACCUMULATE if ACCUMULATE > 1 else loss).backward()
    optimizer.step()
    if it % 5 == 0:
        losses = {"train": loss.detach()}
        print(f"step {it}: train loss {losses['train']:.4f}")

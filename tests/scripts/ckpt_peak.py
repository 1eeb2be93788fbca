"""The two models of issue 36 item 6, whose checkpointing figure counted the saved activations
removed where the peak after the change is set by what checkpointing brings back, one per
argv[1] (``--steps N`` after it):

* ``attention``: two blocks of naive attention over a long sequence and a narrow width, so the
  N x N scores (and their gradients in backward) dominate the peak; with checkpointing the last
  block's recomputed scores and their backward transients are live again at its backward;
* ``cnn``: a stem at full resolution, then six convolution blocks (conv, BatchNorm, ReLU) after
  a downsampling: each block saves its own output (the ReLU's), which stays alive under
  checkpointing as the next block's input, and a block's backward holds three maps of its
  size (the gradients in and out, BatchNorm's normalised copy).
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("case", choices=["attention", "cnn"])
p.add_argument("--steps", type=int, default=4)
args = p.parse_args()
torch.manual_seed(0)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        attn = self.drop(scores.softmax(dim=-1))
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = Attention(d, heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.ln(x))


class AttentionModel(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 16, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class ConvBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class StemCNN(nn.Module):
    def __init__(self, c: int = 32, blocks: int = 6) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.blocks = nn.ModuleList(ConvBlock(c) for _ in range(blocks))
        self.fc = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.stem(x))
        for block in self.blocks:
            x = block(x)
        return self.fc(x.mean(dim=(2, 3)))


if args.case == "attention":
    model: nn.Module = AttentionModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        idx = torch.randint(0, 64, (4, 385))
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
else:
    model = StemCNN()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    for _ in range(args.steps):
        x = torch.randn(8, 3, 64, 64)
        loss = F.cross_entropy(model(x), torch.randint(0, 10, (8,)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

"""A word-level language model's batches, as pytorch/examples' word_language_model makes them:
each batch is a slice (a view) of the whole batchified corpus, and the embedding saves its
indices for backward. argv: steps (default 6)."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
torch.manual_seed(0)
SEQ, BATCH, VOCAB = 35, 20, 100
corpus = torch.randint(0, VOCAB, (50_000, BATCH))  # 7.63 MiB of int64 tokens


class LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.out = nn.Linear(32, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(x))


model = LM()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(steps):
    i = step * SEQ
    x, y = corpus[i:i + SEQ], corpus[i + 1:i + 1 + SEQ]  # views into the corpus
    loss = F.cross_entropy(model(x).view(-1, VOCAB), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()

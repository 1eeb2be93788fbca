"""Complex parameters and activations, a sparse embedding (sparse gradients) and a sparse
matrix product: ``complex_sparse.py OUT``."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import finish, seed


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16, sparse=True)
        self.spectral = nn.Parameter(torch.randn(16, 16, dtype=torch.complex64) * 0.1)
        self.head = nn.Linear(16, 4)
        idx = torch.tensor([[0, 1, 2, 3, 5, 7], [1, 0, 3, 2, 7, 5]])
        self.register_buffer("adj", torch.sparse_coo_tensor(idx, torch.ones(6), (8, 8)).coalesce())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)                      # (8, 16), sparse gradient for the table
        h = torch.sparse.mm(self.adj, h) + h        # sparse x dense
        z = h.to(torch.complex64) @ self.spectral   # complex activations
        return self.head(z.abs())


seed()
model = Net()
dense = [p for n, p in model.named_parameters() if n != "embed.weight"]
opt_sparse = torch.optim.SGD([model.embed.weight], lr=0.1)
opt = torch.optim.Adam(dense, lr=1e-2)
losses = []
for step in range(8):
    tokens, y = torch.randint(0, 50, (8,)), torch.randint(0, 4, (8,))
    loss = F.cross_entropy(model(tokens), y)
    loss.backward()
    assert model.embed.weight.grad.is_sparse
    opt.step()
    opt_sparse.step()
    opt.zero_grad()
    opt_sparse.zero_grad()
    losses.append(loss.item())
finish(sys.argv[1], losses, model)

"""A small training loop whose peak has a working set beside the activations (float32 logits
over a 512-word vocabulary, their log-softmax for the loss), with dropout (the RNG) and Adam.
Prints each step's loss exactly (repr), so runs can be compared bit for bit.

argv: [steps] [--batch N]"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

steps = int(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else 5
batch = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 32
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(512, 64), nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.1),
                      nn.Linear(256, 64), nn.Linear(64, 512))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(steps):
    x = torch.randint(0, 512, (batch, 64))
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, 512), x.view(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")

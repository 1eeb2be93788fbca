"""pytorch/examples word_language_model (main.py, model.py, default options): an Embedding, a
2-layer LSTM with dropout 0.2, a Linear decoder over the vocabulary and `F.log_softmax` returned by
the model, NLLLoss, truncated BPTT of 35 with the hidden state detached (repackage_hidden), no
optimizer object: gradients clipped and applied by hand (`p.data.add_(p.grad, alpha=-lr)`).
The Wikitext-2 vocabulary (33k) shrunk to 8k; batch 20."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

NTOKEN, EMSIZE, NHID, NLAYERS, BPTT, DROPOUT = 8000, 200, 200, 2, 35, 0.2
# argv: [steps] [--batch N] [--accumulate K]: K micro-batches of N columns per update
BATCH = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 20
ACCUMULATE = int(sys.argv[sys.argv.index("--accumulate") + 1]) if "--accumulate" in sys.argv else 1


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(DROPOUT)
        self.encoder = nn.Embedding(NTOKEN, EMSIZE)
        self.rnn = nn.LSTM(EMSIZE, NHID, NLAYERS, dropout=DROPOUT)
        self.decoder = nn.Linear(NHID, NTOKEN)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, NTOKEN)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        w = next(self.parameters())
        return (w.new_zeros(NLAYERS, bsz, NHID), w.new_zeros(NLAYERS, bsz, NHID))


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


torch.manual_seed(1111)
train_data = torch.randint(0, NTOKEN, (20_000 // (BATCH * ACCUMULATE), BATCH * ACCUMULATE))
model = RNNModel()
criterion = nn.NLLLoss()
lr = 20.0
hiddens = [model.init_hidden(BATCH) for _ in range(ACCUMULATE)]  # one hidden state per micro-batch
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
model.train()
for batch, i in enumerate(range(0, min(steps * BPTT, train_data.size(0) - 1 - BPTT), BPTT)):
    model.zero_grad()
    for m in range(ACCUMULATE):
        cols = slice(m * BATCH, (m + 1) * BATCH)
        data, targets = train_data[i:i + BPTT, cols], train_data[i + 1:i + 1 + BPTT, cols].reshape(-1)
        hidden = repackage_hidden(hiddens[m])
        output, hidden = model(data, hidden)
        hiddens[m] = hidden
        loss = criterion(output, targets)
        (loss / ACCUMULATE if ACCUMULATE > 1 else loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    if batch % 5 == 0:
        print(f"| batch {batch} | loss {loss.item():5.2f}")

"""Not a tensor leak, and still the machine's memory grows: DataLoader workers reading a dataset
held as a list of Python objects copy it, page by page, into their own memory (each read writes
an object's reference count: copy-on-read in forked workers, pytorch/pytorch#13246). With
``--numpy`` the same data sits in one numpy array whose pages no worker writes.

    memscope attach examples/leaks/dataloader_workers.py && memscope leaks RUN.db
    memscope attach examples/leaks/dataloader_workers.py --numpy   # no growth

At default options (the attach supervisor samples the workers twice a second) the report says
"WORKERS 2 of 2 DataLoader worker(s) copied ... of the dataset into private memory" with the fix.
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from _common import model_for


class Records(Dataset):
    """Rows of features as Python lists of floats (or one float32 numpy array with --numpy)."""

    def __init__(self, n: int, width: int, as_numpy: bool) -> None:
        rng = np.random.default_rng(0)
        data = rng.standard_normal((n, width)).astype(np.float32)
        self.rows = data if as_numpy else [list(map(float, row)) for row in data]
        self.labels = rng.integers(0, 10, n)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return torch.tensor(self.rows[i], dtype=torch.float32), int(self.labels[i])


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=60_000)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--numpy", action="store_true", help="hold the rows in a numpy array: the fix")
    args = p.parse_args()
    data = Records(args.rows, args.width, args.numpy)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        persistent_workers=True, multiprocessing_context="fork")
    model = model_for(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
    print(f"{steps} steps, last loss {loss.item():.3f}")

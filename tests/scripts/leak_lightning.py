"""Two leaks in a Lightning run (tests/test_leak_holders.py): an attribute of the LightningModule
appended in training_step, and an attribute of a Trainer callback appended after each batch."""

import sys

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Lit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
        self.step_outputs = []

    def training_step(self, batch, i):
        x, y = batch
        out = self.net(x)
        loss = F.cross_entropy(out, y)
        self.step_outputs.append(out.detach().repeat(1, 3))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Keep(pl.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        self.seen.append(batch[0][:, :7].clone())


def main(steps):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64 * steps, 32), torch.randint(0, 4, (64 * steps,)))
    trainer = pl.Trainer(max_steps=steps, callbacks=[Keep()], logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(Lit(), DataLoader(data, batch_size=64))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)

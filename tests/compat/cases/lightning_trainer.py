"""Lightning Trainer fitting a LightningModule whose training_step calls ``self.net`` (the
framework never calls the LightningModule itself): ``lightning_trainer.py OUT``."""

import sys

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import finish, seed


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


seed()
data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
loader = torch.utils.data.DataLoader(data, batch_size=8)  # 8 batches, one optimizer step each
model = Classifier()
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, deterministic=True)
trainer.fit(model, loader)
finish(sys.argv[1], model.losses, model)

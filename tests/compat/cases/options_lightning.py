"""The README's options through Lightning's MemscopeCallback: ``options_lightning.py DB JSON``."""

import json
import sys

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F

from memscope.integrations.lightning import MemscopeCallback

db, kwargs = sys.argv[1], json.loads(sys.argv[2])


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[MemscopeCallback(db, **kwargs)])
trainer.fit(Classifier(), torch.utils.data.DataLoader(data, batch_size=8))

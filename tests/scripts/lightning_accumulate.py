"""A Lightning Trainer accumulating 2 batches per optimizer step. Lightning runs every
training_step inside the closure it passes to optimizer.step(): one forward there is not an
optimizer re-evaluating its closure (LBFGS)."""
import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                 nn.Linear(1024, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(2048, 256), torch.randint(0, 10, (2048,)))
loader = torch.utils.data.DataLoader(data, batch_size=512)
pl.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
           enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=2,
           deterministic=True).fit(Classifier(), loader)

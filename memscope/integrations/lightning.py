"""Lightning: ``Trainer(callbacks=[MemscopeCallback("run.db", name="exp-1")])``.

Starts memscope when ``fit`` starts (or joins the agent of ``memscope attach``), marks a step
at each optimizer step (``trainer.global_step``; with ``accumulate_grad_batches=4`` one step
per 4 batches), stops when ``fit`` ends or fails.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from memscope.integrations.session import Session


class MemscopeCallback(Callback):
    def __init__(self, db: str | None = None, name: str | None = None, **options: Any) -> None:
        """``db``: run file (default ``memscope-<script>-<time>.db``; ignored under attach, whose
        file is used); ``name``: recorded as the run's name; ``options``: as ``memscope.start``."""
        super().__init__()
        self.session = Session("lightning", db, name, options)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.session.begin(trainer.global_step)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        self.session.step(trainer.global_step)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.session.end()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule,
                     exception: BaseException) -> None:
        self.session.end()

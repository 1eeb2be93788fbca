"""Hugging Face: ``Trainer(..., callbacks=[MemscopeCallback("run.db", name="exp-1")])``.

Starts memscope when training begins (or joins the agent of ``memscope attach``), marks a step
at each optimizer step (``on_step_end``, which the Trainer calls once per
``gradient_accumulation_steps`` micro-batches; ``state.global_step``), stops when it ends.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from memscope.integrations.session import Session


class MemscopeCallback(TrainerCallback):
    def __init__(self, db: str | None = None, name: str | None = None, **options: Any) -> None:
        """``db``: run file (default ``memscope-<script>-<time>.db``; ignored under attach, whose
        file is used); ``name``: recorded as the run's name (default: ``args.run_name``);
        ``options``: as ``memscope.start``."""
        self.session = Session("huggingface", db, name, options)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        if self.session.name is None:
            self.session.name = getattr(args, "run_name", None)
        self.session.begin(state.global_step)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        self.session.step(state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self.session.end()

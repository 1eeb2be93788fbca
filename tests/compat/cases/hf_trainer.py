"""Hugging Face Trainer on a tiny GPT-2 built in code (nothing downloaded): ``hf_trainer.py OUT``."""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from _common import finish, seed

out = sys.argv[1]


class Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (32, 16), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Recording(Trainer):
    losses: list[float] = []

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        self.losses.append((loss[0] if return_outputs else loss).item())
        return loss


seed()
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
args = TrainingArguments(output_dir=out + ".trainer", max_steps=8, per_device_train_batch_size=4,
                         learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no",
                         logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                         seed=0)
trainer = Recording(model=model, args=args, train_dataset=Tokens())
trainer.train()
finish(out, Recording.losses, model)

"""The README's options through the Hugging Face MemscopeCallback: ``options_hf.py DB JSON``."""

import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from memscope.integrations.huggingface import MemscopeCallback

db, kwargs = sys.argv[1], json.loads(sys.argv[2])


class Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
args = TrainingArguments(output_dir=db + ".trainer", max_steps=8, per_device_train_batch_size=4,
                         use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                         disable_tqdm=True, dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=Tokens(),
        callbacks=[MemscopeCallback(db, **kwargs)]).train()

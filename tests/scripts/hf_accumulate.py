"""A Hugging Face Trainer on a tiny GPT-2 built in code (nothing downloaded), accumulating 4
micro-batches per optimizer step."""
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 256, (256, 64), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=2))
args = TrainingArguments(output_dir=sys.argv[1], max_steps=8, per_device_train_batch_size=8,
                         gradient_accumulation_steps=4, learning_rate=1e-3, use_cpu=True, report_to=[],
                         save_strategy="no", logging_strategy="no", disable_tqdm=True,
                         dataloader_num_workers=0, seed=0)
Trainer(model=model, args=args, train_dataset=Tokens()).train()

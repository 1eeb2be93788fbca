"""The Hugging Face Trainer on a tiny GPT-2 built from a config (nothing downloaded): the model
computes its loss from `labels` (float32 logits), AdamW, no accumulation; the output directory
is a temporary one."""
import sys
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 8000, (2048, 64), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=8000, n_positions=64, n_embd=128, n_layer=2, n_head=4))
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
# argv: [steps] [--batch N] [--accumulate K]: K micro-batches of N per optimizer step
BATCH = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 16
ACCUMULATE = int(sys.argv[sys.argv.index("--accumulate") + 1]) if "--accumulate" in sys.argv else 1
args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="hf-trainer-"), max_steps=steps,
                         per_device_train_batch_size=BATCH, gradient_accumulation_steps=ACCUMULATE,
                         learning_rate=1e-3, use_cpu=True, report_to=[],
                         save_strategy="no", logging_strategy="no", disable_tqdm=True,
                         dataloader_num_workers=0, seed=0)
Trainer(model=model, args=args, train_dataset=Tokens()).train()

"""The framework's own switch for a technique, said before the plain-PyTorch change.

A Hugging Face Trainer or Lightning user does not write the loop the generic advice edits: the
same change is a TrainingArguments field or a Trainer argument. The framework comes from the
agent's ``framework`` event (what the script imported by the end of step 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memscope.store.reader import RunReader


def framework_of(reader: "RunReader") -> str | None:
    """``"transformers"`` (the Hugging Face Trainer), ``"lightning"``, or None (a plain loop)."""
    for e in reader.events("framework"):
        name = (e["data"] or {}).get("framework")
        if isinstance(name, str):
            return name
    return None


def framework_how(framework: str | None, technique: str, micro_batches: int = 1) -> str | None:
    """The framework's way to apply ``technique`` (None: none of its own, or no framework).
    ``micro_batches``: how many the script already accumulates per optimizer step."""
    k = 2 * micro_batches
    if framework == "transformers":
        return {
            "gradient_accumulation": (
                f"with the Hugging Face Trainer: halve per_device_train_batch_size and set "
                f"TrainingArguments(gradient_accumulation_steps={k}) (the Trainer divides the loss)"),
            "mixed_precision": (
                "with the Hugging Face Trainer: TrainingArguments(bf16=True) (fp16=True on GPUs "
                "without bf16: the Trainer adds the GradScaler)"),
            "activation_checkpointing": (
                "with the Hugging Face Trainer: TrainingArguments(gradient_checkpointing=True, "
                "gradient_checkpointing_kwargs={\"use_reentrant\": False}) checkpoints every "
                "transformer block of models that support it"),
            "efficient_attention": (
                "with a transformers model: build or load it with attn_implementation=\"sdpa\" "
                "(from_pretrained(..., attn_implementation=\"sdpa\"), or on its config)"),
            "lighter_optimizer": (
                "with the Hugging Face Trainer: TrainingArguments(optim=\"adafactor\"), or "
                "optim=\"adamw_bnb_8bit\" on CUDA"),
        }.get(technique)
    if framework == "lightning":
        return {
            "gradient_accumulation": (
                f"with Lightning: Trainer(accumulate_grad_batches={k}) and the DataLoader's "
                "batch_size halved (Lightning divides the loss)"),
            "mixed_precision": (
                "with Lightning: Trainer(precision=\"bf16-mixed\") (\"16-mixed\" on GPUs without "
                "bf16: Lightning adds the GradScaler)"),
        }.get(technique)
    return None

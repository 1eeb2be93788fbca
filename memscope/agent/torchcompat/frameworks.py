"""Which training framework drives the loop, read from what the script has imported: the
suggestions then name the framework's own switches (``TrainingArguments(bf16=True)``,
``Trainer(precision="bf16-mixed")``) besides the plain-PyTorch change."""

from __future__ import annotations

import sys
from typing import Any

# (module that only a user of the trainer imports, framework id, its words, distribution)
_TRAINERS = (
    ("transformers.trainer", "transformers", "Hugging Face Trainer", "transformers"),
    ("lightning.pytorch.trainer.trainer", "lightning", "Lightning Trainer", "lightning"),
    ("pytorch_lightning.trainer.trainer", "lightning", "Lightning Trainer", "pytorch_lightning"),
)


def detect() -> dict[str, Any] | None:
    """The framework whose trainer module is imported, or None for a plain loop. Nothing is
    imported here: only ``sys.modules`` is read."""
    for module, name, words, dist in _TRAINERS:
        if module in sys.modules:
            version = getattr(sys.modules.get(dist), "__version__", None)
            return {"framework": name, "label": words, "version": version}
    return None

"""A profiled step's memory by kind: the models' parameters, gradients, optimizer state, and the
activations at their peak, each storage counted once."""

from __future__ import annotations

from typing import Any

import torch

from memscope.agent.collectors.layers.tensors import storage_key
from memscope.agent.torchcompat.optimizer_state import optimizer_state_tensors


def breakdown(models: list[Any], optimizers: list[Any], activations: int) -> dict[str, int]:
    """Parameters, gradients and optimizer state of ``models`` and ``optimizers`` by unique
    storage, and ``activations`` (the step's live saved bytes at their peak)."""
    seen: set[tuple[int, int]] = set()

    def add(t: Any) -> int:
        if not isinstance(t, torch.Tensor):
            return 0
        try:
            key = storage_key(t)
            if key[1] == 0 or key in seen:
                return 0
            seen.add(key)
            return int(t.untyped_storage().nbytes())
        except Exception:
            return 0

    params: list[Any] = []
    for root in models:
        params.extend(root.parameters())
    for opt in optimizers:
        for group in getattr(opt, "param_groups", []):
            params.extend(group.get("params", []))
    out = {"parameters": sum(add(p) for p in params),
           "gradients": sum(add(getattr(p, "grad", None)) for p in params),
           "optimizer_state": 0, "activations": int(activations)}
    out["optimizer_state"] = sum(add(v) for v in optimizer_state_tensors(optimizers))
    return out

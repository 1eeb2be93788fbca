"""The tensors an optimizer keeps in ``opt.state``, for every collector that counts them.

Most optimizers keep tensors as the values of each parameter's state dict (Adam's ``exp_avg``);
LBFGS keeps lists of them as well (``old_dirs``, ``old_stps``, ``ro``, ``al``: a history that
grows to ``history_size``), so lists and tuples are looked into, one level deep.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch


def optimizer_state_tensors(optimizers: Iterable[Any]) -> list[torch.Tensor]:
    """Every tensor in the optimizers' state (shared ones once per appearance)."""
    out: list[torch.Tensor] = []
    for opt in list(optimizers):
        for state in list(getattr(opt, "state", {}).values()):
            if not isinstance(state, dict):
                continue
            for v in list(state.values()):
                if isinstance(v, torch.Tensor):
                    out.append(v)
                elif isinstance(v, (list, tuple)):
                    out.extend(x for x in list(v) if isinstance(x, torch.Tensor))
    return out

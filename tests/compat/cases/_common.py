"""Shared by the compatibility cases: seeds, and saving what the harness compares."""

from __future__ import annotations

import sys
from typing import Any

import torch

END = "compat: end of script"  # tests/compat/harness.py cuts memscope's lines after it


def seed(n: int = 0) -> None:
    torch.manual_seed(n)


def dynamo_counters() -> dict[str, int]:
    """The graph counts torch.compile must not change: graphs, graph breaks, recompiles."""
    from torch._dynamo.utils import counters

    return {"unique_graphs": int(counters["stats"]["unique_graphs"]),
            "calls_captured": int(counters["stats"]["calls_captured"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "recompiles": int(sum(counters["recompiles"].values())),
            "frames_ok": int(counters["frames"]["ok"])}


def finish(path: str, losses: list[Any], params: Any, **extra: Any) -> None:
    """Save the losses (Python floats from ``loss.item()``: exact, as float32 widens to float
    exactly; a healthy loop keeps no loss tensor), the final parameters and extra facts; END on
    stderr, last."""
    if isinstance(params, torch.nn.Module):
        params = {k: v.detach().clone() for k, v in params.state_dict().items()}
    torch.save({"losses": torch.tensor(losses, dtype=torch.float64),
                "params": params, **extra}, path)
    sys.stdout.flush()
    sys.stderr.write(END + "\n")  # one write: ranks sharing the stream cannot split it
    sys.stderr.flush()

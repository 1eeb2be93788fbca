"""Removing the agent's hooks from the program's modules, tensors and graph nodes."""

from __future__ import annotations

from typing import Any, Iterable


def remove_quietly(handles: Iterable[Any]) -> None:
    """``remove()`` each hook handle. One that fails (its module or graph already freed, a
    handle of a torch build that behaves otherwise) is passed over: the others still go, and
    nothing of the agent's clean-up may raise into the training."""
    for handle in list(handles):
        try:
            handle.remove()
        except Exception:
            pass

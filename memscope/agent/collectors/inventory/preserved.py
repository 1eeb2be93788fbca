"""Tensor objects that only an autograd graph keeps: not live in Python.

An op run from Python gives its output a Python object; when the script drops it but a graph
saved the tensor for backward, torch keeps ("preserves") that object for as long as the tensor
lives. The collector still tracks it, so the registry of live tensors finds it among the
script's own — and an inventory would count a leaked graph's saved activations as loose tensors,
or walk every graph of a kind to find them in their graphs. Such an object is referenced by its
tensor's C++ side alone: its reference count is that one reference plus the scan's own, and the
tensor is shared with C++ (``_use_count() > 1``). How many references that makes is measured here
on a tiny graph, in a loop shaped like the scan's (Python and torch versions differ); where a
preserved object cannot be told from one the script holds, nothing is left out."""

from __future__ import annotations

import sys

import torch

_measured: list[int | None] = []


def preserved_refs() -> int | None:
    """``sys.getrefcount`` of a preserved tensor object inside ``for t in tensors:`` (the list's
    entry, the loop variable and the call's argument included), or None."""
    if not _measured:
        _measured.append(_measure())
    return _measured[0]


def _measure() -> int | None:
    try:
        with torch.enable_grad():
            x = torch.ones(1, requires_grad=True)
            held = x.sin()
            kept = (held.cos(), x.exp().cos())  # the second saves exp's output, which no one holds
            plain = torch.ones(1)
            tensors = [held, kept[1].grad_fn._raw_saved_self.data, plain]  # type: ignore[union-attr]
        counts: list[tuple[int, bool]] = []
        refcount = sys.getrefcount
        for t in tensors:  # the scan's loop shape
            counts.append((refcount(t), t._use_count() > 1))
        del t
        (held_rc, held_shared), (pres_rc, pres_shared), (plain_rc, _) = counts
        if not (pres_shared and held_shared and held_rc > pres_rc and plain_rc >= pres_rc):
            return None
        del held, kept, plain, tensors, x
        return pres_rc
    except Exception:
        return None


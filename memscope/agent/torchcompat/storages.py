"""The storages that hold a tensor's memory, for the agent's exact live-tensor counters
(whatif's :class:`memscope.agent.collectors.tensor_peak.TensorPeak`, the fake run's ledger).

A strided tensor has one storage; a sparse tensor has none of its own (``untyped_storage()``
raises) but holds its index and value tensors' storages; a meta tensor holds no memory at all.
Leaving sparse tensors out made both counters miss a sparse embedding's gradient the same way,
so comparing them could not show it (torch.profiler's allocator events did).
"""

from __future__ import annotations

from typing import Any

import torch

_COMPRESSED = {torch.sparse_csr: ("crow_indices", "col_indices"), torch.sparse_bsr: ("crow_indices", "col_indices"),
               torch.sparse_csc: ("ccol_indices", "row_indices"), torch.sparse_bsc: ("ccol_indices", "row_indices")}


def storages(t: torch.Tensor) -> list[tuple[Any, int]]:
    """(storage, bytes) for each storage holding ``t``'s memory; [] for a meta tensor. Raises
    for a tensor whose memory cannot be read (a wrapper subclass without storage)."""
    if t.device.type == "meta":
        return []
    layout = t.layout
    if layout is torch.strided:
        st = t.untyped_storage()
        return [(st, int(st.nbytes()))]
    if layout is torch.sparse_coo:
        parts = [t._indices(), t._values()]
    elif layout in _COMPRESSED:
        index, other = _COMPRESSED[layout]
        parts = [getattr(t, index)(), getattr(t, other)(), t.values()]
    else:
        raise TypeError(f"no storage known for layout {layout}")
    out = []
    for p in parts:
        st = p.untyped_storage()
        # a fake (FakeTensorMode) sparse part's storage says 0 bytes: its size is still known
        out.append((st, max(int(st.nbytes()), p.numel() * p.element_size())))
    return out


def storage_address(s: Any) -> int:
    """The address of a storage's memory, 0 for one without memory. A meta storage (a
    FakeTensor's: torch.compile keeps some alive in its caches) answers 0 without being asked
    for its data pointer, which on a FakeTensor's storage warns into the program's output."""
    if s.device.type == "meta":
        return 0
    return int(s.data_ptr())


def storage_parts(t: torch.Tensor) -> list[tuple[int, int]]:
    """(address, bytes) of each storage holding ``t``'s memory: one for a strided tensor, a
    sparse tensor's index and value storages; [] for a meta tensor or one without memory.
    Raises as :func:`storages` does."""
    out = []
    for st, n in storages(t):
        ptr = storage_address(st)
        if ptr:
            out.append((ptr, n))
    return out


def dtype_text(t: torch.Tensor) -> str:
    """``float32``; for a tensor of another layout than strided, with it: ``float32 sparse_coo``
    (an inventory's group of sparse tensors is not its dense twin's)."""
    text = str(t.dtype).replace("torch.", "")
    layout = t.layout
    return text if layout is torch.strided else f"{text} {str(layout).replace('torch.', '')}"


def extent_bytes(t: torch.Tensor) -> int:
    """The bytes a strided tensor spans in its storage (a view's own elements, strides
    included), which is less than the storage's for a slice of a bigger tensor."""
    if t.numel() == 0:
        return 0
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return span * t.element_size()

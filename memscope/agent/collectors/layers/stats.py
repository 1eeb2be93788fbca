"""A module's row of a profiled step, and the merge of rows that end up with one name."""

from __future__ import annotations

from dataclasses import dataclass

NO_MODULE = "<no module>"


@dataclass
class ModuleStats:
    name: str
    type: str
    calls: int = 0
    saved_bytes: int = 0
    saved_tensors: int = 0
    output_bytes: int = 0
    forward_s: float = 0.0
    backward_s: float | None = None  # None: no backward of a counted call ran in the step
    alloc_delta: int | None = None  # CUDA only
    alloc_peak: int | None = None  # CUDA only
    # scaled_dot_product_attention kernels its own forward ran -> calls (math, flash, efficient, ...)
    kernels: dict[str, int] | None = None


def merge_rows(rows: list[ModuleStats]) -> list[ModuleStats]:
    """One row per name (a module reached through two roots, say), most saved bytes first."""
    merged: dict[str, ModuleStats] = {}
    for st in rows:
        m = merged.get(st.name)
        if m is None:
            merged[st.name] = st
        else:
            m.calls += st.calls
            m.saved_bytes += st.saved_bytes
            m.saved_tensors += st.saved_tensors
            m.output_bytes += st.output_bytes
            m.forward_s += st.forward_s
            if st.backward_s is not None:
                m.backward_s = (m.backward_s or 0.0) + st.backward_s
            for k, n in (st.kernels or {}).items():
                m.kernels = m.kernels or {}
                m.kernels[k] = m.kernels.get(k, 0) + n
            if st.alloc_delta is not None:
                m.alloc_delta = (m.alloc_delta or 0) + st.alloc_delta
                m.alloc_peak = max(m.alloc_peak or 0, st.alloc_peak or 0)
    return sorted(merged.values(), key=lambda s: (-s.saved_bytes, s.name))

"""Small reads of tensors and torch state the layer profiler's parts share (bounded, no raise
where a hook calls them on the user's objects)."""

from __future__ import annotations

from typing import Any

import torch

from memscope.agent.collectors.cuda import allocated_and_peak
from memscope.agent.torchcompat.storages import storage_address


def tensor_tree_bytes(obj: Any, depth: int = 0) -> int:
    """Bytes of the tensors in ``obj`` (a tensor, or tuples / lists / dicts of them)."""
    if isinstance(obj, torch.Tensor):
        try:
            return obj.numel() * obj.element_size()
        except Exception:
            return 0
    if depth > 4:
        return 0
    if isinstance(obj, (tuple, list)):
        return sum(tensor_tree_bytes(o, depth + 1) for o in obj)
    if isinstance(obj, dict):
        return sum(tensor_tree_bytes(o, depth + 1) for o in obj.values())
    return 0


def storage_key(t: torch.Tensor) -> tuple[int, int]:
    """(device hash, data pointer) of the storage behind ``t``: one key per storage."""
    return hash(t.device), storage_address(t.untyped_storage())


def tensors(obj: Any, depth: int = 0) -> list[Any]:
    """The tensors in ``obj`` (tuples / lists / dicts, bounded)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    out: list[Any] = []
    if depth < 3 and isinstance(obj, (tuple, list)):
        for o in obj[:16]:
            out.extend(tensors(o, depth + 1))
    elif depth < 3 and isinstance(obj, dict):
        for o in list(obj.values())[:16]:
            out.extend(tensors(o, depth + 1))
    return out


def grad_fns(obj: Any, depth: int = 0, limit: int = 16) -> list[Any]:
    """Distinct grad_fns of the tensors in ``obj`` (tuples / lists / dicts, bounded)."""
    if isinstance(obj, torch.Tensor):  # the common cases first: one tensor, a 1-tuple
        fn = obj.grad_fn
        return [fn] if fn is not None else []
    if type(obj) is tuple and len(obj) == 1 and isinstance(obj[0], torch.Tensor):
        fn = obj[0].grad_fn
        return [fn] if fn is not None else []
    out: list[Any] = []
    todo = [(obj, 0)]
    while todo and len(out) < limit:
        o, d = todo.pop()
        if isinstance(o, torch.Tensor):
            fn = o.grad_fn
            if fn is not None and all(fn is not x for x in out):
                out.append(fn)
        elif d < 3 and isinstance(o, (tuple, list)):
            todo.extend((x, d + 1) for x in o)
        elif d < 3 and isinstance(o, dict):
            todo.extend((x, d + 1) for x in o.values())
    return out


def graph_task_id() -> int:
    """The autograd engine's current graph task: >= 0 only inside a backward pass."""
    try:
        return int(torch._C._current_graph_task_id())
    except Exception:
        return -1


def cuda_ready() -> bool:
    """CUDA is used by the script (never initialised by memscope)."""
    try:
        return bool(torch.cuda.is_initialized())  # never is_available(): see cuda.cuda_devices_in_use
    except Exception:
        return False


def cuda_alloc() -> tuple[int, int]:
    """(allocated, allocated peak) bytes of the current device: host-side counters only."""
    return allocated_and_peak()

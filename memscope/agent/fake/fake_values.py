"""Values for one-element fake tensors, so that arithmetic on placeholders stays consistent.

A fake tensor has no value; reading one gives a placeholder (memscope.agent.fake.fake_ledger). That
alone breaks an ordinary line: ng-video-lecture's ``data[i:i + block_size] for i in ix`` reads
``i`` as 0 and ``i + block_size`` (another 0-dim tensor) as 0 too, so every batch is empty and
the estimate has no activations. :class:`Values` remembers the value each one-element tensor
was read as, and computes one-element ops on those values for real (a few scalar ops, outside
the fake mode), so ``i + block_size`` reads as ``0 + block_size``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

MAX_KNOWN = 100_000  # values kept at most (one per small tensor); forgotten all at once beyond


class Values:
    def __init__(self, serial_of: Callable[[Any], int | None], placeholder: Callable[[Any], Any]) -> None:
        self.serial_of = serial_of
        self.placeholder = placeholder  # tensor -> the value an unknown one reads as
        self.known: dict[tuple[int, int], Any] = {}  # (serial, offset) -> value

    def _key(self, t: Any) -> tuple[int, int] | None:
        """A one-element tensor's place: its storage and offset (``ix[k]`` are views of one)."""
        serial = self.serial_of(t)
        return None if serial is None else (serial, int(t.storage_offset()))

    def read(self, t: Any) -> tuple[bool, Any]:
        """(known, value) of a one-element tensor."""
        key = self._key(t)
        if key is not None and key in self.known:
            return True, self.known[key]
        return False, None

    def remember(self, t: Any, value: Any) -> None:
        key = self._key(t)
        if key is None:
            return
        if len(self.known) >= MAX_KNOWN:
            self.known.clear()
        self.known[key] = value

    def follow(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        """When ``out`` is one element computed from one-element tensors (and Python numbers),
        compute it from their values and remember the result."""
        if not isinstance(out, torch.Tensor) or out.numel() != 1 or out.is_complex():
            return
        tensors = [a for a in _flat(args) if isinstance(a, torch.Tensor)]
        if not tensors:
            constant = _constant(func, args)  # torch.full((), 0.0): GradScaler's found-inf flag
            if constant is not None:
                self.remember(out, constant)
            return
        if any(a.numel() != 1 for a in tensors):
            return
        from torch.utils._python_dispatch import _disable_current_modes

        real: dict[int, Any] = {}
        for a in tensors:
            known, value = self.read(a)
            if not known:
                value = self.placeholder(a)
                self.remember(a, value)
            real[id(a)] = value
        try:
            with _disable_current_modes(), torch._C.DisableTorchFunction():
                def swap(a: Any) -> Any:
                    if isinstance(a, torch.Tensor):
                        return torch.tensor(real[id(a)], dtype=a.dtype).reshape(a.shape)
                    return a

                result = func(*_map(args, swap), **{k: _map(v, swap) for k, v in kwargs.items()})
                if isinstance(result, torch.Tensor) and result.numel() == 1:
                    self.remember(out, result.item())
        except Exception:
            pass  # an op that does not run on plain values: out stays unknown


def _constant(func: Any, args: Any) -> Any:
    aten = torch.ops.aten
    if func in (aten.full.default, aten.full_like.default) and len(args) > 1:
        return args[1]
    if func in (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default):
        return 0
    if func in (aten.ones.default, aten.ones_like.default, aten.new_ones.default):
        return 1
    if func is aten.scalar_tensor.default and args:
        return args[0]
    return None


def _flat(obj: Any, depth: int = 0) -> list[Any]:
    if isinstance(obj, (tuple, list)) and depth < 2:
        return [x for o in obj for x in _flat(o, depth + 1)]
    return [obj]


def _map(obj: Any, fn: Callable[[Any], Any], depth: int = 0) -> Any:
    if isinstance(obj, (tuple, list)) and depth < 2:
        return type(obj)(_map(o, fn, depth + 1) for o in obj)
    return fn(obj)

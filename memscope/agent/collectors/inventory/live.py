"""Which tensors are alive, found without walking every Python object of the process.

A ``gc.get_objects()`` walk costs in proportion to every object the process holds: about 25 ms
after a bare ``import torch``, half a second beside a 5-million-object dataset. Instead, tensors
are kept in a registry of weak references fed from where new objects live. CPython's cyclic GC
keeps every container object in one of three generations; a new object starts in the youngest
and reaches the oldest only when a collection of generation 1 or 2 promotes the survivors. So:

* a ``gc.callbacks`` hook sees each such collection start and registers the tensors among the
  young objects it is about to promote (a few thousand objects between two collections);
* an inventory registers the tensors still in the young generations.

Both pick tensors by ``issubclass(type(o), TensorBase)``, so instances of a Tensor subclass
defined later (``DTensor`` when an optimizer imports torch.distributed) are found too.

Registry plus young generations is every live tensor that has a Python object, at a cost that
grows with the tensors and the objects made since the last collection, not with everything the
process holds. A full walk is done when the registry starts (at agent start, before the script
has built much) and again whenever that premise may not hold: ``gc.freeze()`` moved objects, the
hook was removed by someone else or failed, too much queued up between two inventories, or a
Python whose collector is not generational this way (CPython 3.14's incremental collector: full
walks every time). A full walk adds to what the registry knew, it does not replace it.

Only weak references are kept between inventories; ``tensors()`` hands out strong references in
a list the caller clears before it returns.
"""

from __future__ import annotations

import gc
import sys
import weakref
from itertools import compress, repeat
from typing import Any

import torch

# generations 0 and 1 are "young": objects move to 2 only through a collection we are told of
_GENERATIONAL = sys.implementation.name == "cpython" and sys.version_info < (3, 14)
MAX_PENDING = 1_000_000  # weak references the hook may queue between two inventories


def tensor_types() -> frozenset[type]:
    """``torch.Tensor`` and every subclass defined so far (``nn.Parameter``, ``FakeTensor`` ...)."""
    out = {torch.Tensor}
    todo = [torch.Tensor]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return frozenset(out)


def _pick(objects: list[Any], types: frozenset[type]) -> list[Any]:
    """The objects whose exact type is one of ``types``, at C speed. ``type(o)``, never
    ``isinstance``: some lazy proxies answer ``__class__`` with side effects."""
    return list(compress(objects, map(types.__contains__, map(type, objects))))


def _pick_any(objects: list[Any]) -> list[Any]:
    """The tensors among ``objects``, of any Tensor subclass, even one defined after the
    registry started (``issubclass`` on the exact type: C speed, no call into the objects)."""
    return list(compress(objects, map(issubclass, map(type, objects), repeat(torch._C.TensorBase))))


class LiveTensors:
    """The registry. ``install`` at agent start, ``tensors`` at each inventory (training thread),
    ``remove`` at stop; ``after_fork`` in a forked child (a DataLoader worker) drops it all."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ReferenceType[Any]] = {}  # id -> ref, oldest first
        self._pending: list[weakref.ReferenceType[Any]] = []  # queued by the gc hook
        self._valid = False  # False: the next tensors() walks everything
        self._freeze_count = -1
        self._hooked = False
        self._hook = self._on_gc  # one bound method: what gc.callbacks holds and is checked for
        self.full_scans = 0
        self.last_full = False  # whether the last tensors() walked every object

    # -- life cycle ----------------------------------------------------------------------------

    def install(self) -> None:
        """Start the registry: one full walk now, then the gc hook keeps it up to date."""
        if _GENERATIONAL and not self._hooked:
            gc.callbacks.append(self._hook)
            self._hooked = True
        self._full(tensor_types()).clear()

    @property
    def installed(self) -> bool:
        """Whether the registry runs (its gc hook in place): ``tensors()`` is cheap then."""
        return self._hooked

    def remove(self) -> None:
        self._unhook()
        self._refs = {}
        self._pending = []
        self._valid = False

    def after_fork(self) -> None:
        """In a forked child: the hook came along; a worker must not build a registry."""
        self.remove()

    def _unhook(self) -> None:
        if self._hooked:
            self._hooked = False
            try:
                gc.callbacks.remove(self._hook)
            except ValueError:
                pass

    # -- the gc hook (any thread, inside a collection's start) -------------------------------

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "start" or info.get("generation", 0) < 1 or not self._valid:
            return
        try:
            young = self._young()
            pending = self._pending
            if len(pending) + len(young) > MAX_PENDING:
                self._valid = False  # a full walk at the next inventory instead
                self._pending = []
            else:
                pending.extend(map(weakref.ref, young))
            young.clear()
        except Exception:
            self._valid = False

    @staticmethod
    def _young() -> list[Any]:
        out: list[Any] = []
        for generation in (0, 1):
            objects = gc.get_objects(generation)
            out.extend(_pick_any(objects))
            objects.clear()
        return out

    # -- at an inventory -----------------------------------------------------------------------

    def tensors(self) -> list[Any]:
        """Every live tensor that has a Python object, oldest registered first. Strong
        references: the caller clears the list before it returns."""
        if (not self._hooked or not self._valid
                or gc.get_freeze_count() != self._freeze_count
                or not any(cb is self._hook for cb in gc.callbacks)):
            return self._full(tensor_types())
        self.last_full = False
        refs = self._refs
        pending, self._pending = self._pending, []
        for r in pending:
            t = r()
            if t is not None:
                self._register(refs, t, r)
        pending.clear()
        young = self._young()
        for t in young:
            self._register(refs, t, None)
        young.clear()
        got = [r() for r in refs.values()]  # comprehensions: 100k tensors a time
        out = [t for t in got if t is not None]  # (not ``None in got``: that calls Tensor.__eq__)
        if len(out) < len(got):  # dead ones: forget them
            for k in [k for k, r in refs.items() if r() is None]:
                del refs[k]
        got.clear()
        return out

    @staticmethod
    def _register(refs: dict[int, Any], t: Any, r: Any) -> None:
        k = id(t)
        old = refs.get(k)
        if old is not None and old() is t:
            return
        try:
            r = r if r is not None else weakref.ref(t)
        except TypeError:
            return
        if old is not None:
            del refs[k]  # a dead tensor's id, reused: the new one goes to the end (youngest)
        refs[k] = r

    def _full(self, types: frozenset[type]) -> list[Any]:
        """Walk every object; what the registry already knew stays (a tensor ``gc.freeze()``
        moved out of every generation is invisible to the walk, not dead)."""
        objects = gc.get_objects()  # youngest generation first
        try:
            found = _pick(objects, types)
        finally:
            objects.clear()
        found.reverse()  # oldest first
        refs: dict[int, Any] = {}
        out: list[Any] = []
        for k, r in self._refs.items():
            t = r()
            if t is not None:
                refs[k] = r
                out.append(t)
        for t in found:
            if id(t) not in refs:
                try:
                    refs[id(t)] = weakref.ref(t)
                except TypeError:
                    continue
                out.append(t)
        found.clear()
        self._refs = refs
        self._pending = []
        self._freeze_count = gc.get_freeze_count()
        self._valid = self._hooked
        self.full_scans += 1
        self.last_full = True
        return out

"""Which tensors are alive, found without walking every Python object of the process.

A ``gc.get_objects()`` walk costs in proportion to every object the process holds: about 25 ms
after a bare ``import torch``, half a second beside a 5-million-object dataset. Instead, tensors
are kept in a registry of weak references fed from where new objects live. CPython's cyclic GC
keeps every container object in one of three generations; a new object starts in the youngest
and reaches the oldest only when a collection of generation 1 or 2 promotes the survivors. So:

* a ``gc.callbacks`` hook sees each such collection start and registers the tensors among the
  young objects it is about to promote (a few thousand objects between two collections);
* an inventory registers the tensors still in the young generations. With no collection since
  the last inventory (a script that called ``gc.disable()``: generation 0 then holds every
  object made since, hundreds of thousands), it looks only past a mark it left at the end of
  generation 0 then; the list of generation 0 is still made (12 ms for 200k objects).

Both pick tensors by ``issubclass(type(o), TensorBase)``, so instances of a Tensor subclass
defined later (``DTensor`` when an optimizer imports torch.distributed) are found too.

Registry plus young generations is every live tensor that has a Python object, at a cost that
grows with the tensors and the objects made since the last collection, not with everything the
process holds. A full walk is done when the registry starts (at agent start, before the script
has built much; none when attach's agent starts as ``import torch`` ends, before any tensor
exists) and again whenever that premise may not hold: ``gc.unfreeze()`` moved objects into the
oldest generation, the hook was removed by someone else or failed, too much queued up
between two inventories, or a Python whose collector is not generational this way (CPython
3.14's incremental collector: full walks every time). A full walk adds to what the registry
knew, it does not replace it. ``gc.freeze()`` moves objects where no walk sees them: tensors the
registry knew stay known; one made since the last look and frozen is not seen until unfrozen.

Only weak references are kept between inventories; ``tensors()`` hands out strong references in
a list the caller clears before it returns.
"""

from __future__ import annotations

import gc
import sys
import weakref
from itertools import compress, repeat
from operator import is_
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


def _collections() -> int:
    """Collections of any generation so far (read at a collection's start: not yet counted)."""
    return sum(g["collections"] for g in gc.get_stats())


def _after(objects: list[Any], mark: Any) -> list[Any] | None:
    """The objects after ``mark`` (found by identity, from the end), or None if it is not there."""
    hits = compress(range(len(objects) - 1, -1, -1), map(is_, reversed(objects), repeat(mark)))
    i = next(hits, None)  # lazily, at C speed: it stops at the mark
    return None if i is None else objects[i + 1:]


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
        self._mark: list[Any] | None = None  # see _young
        self._mark_runs = -1
        self.looked_at = 0  # objects the last young walk looked at
        self.since_mark = False  # ... only those after its mark
        self.last_full = False  # whether the last tensors() walked every object

    # -- life cycle ----------------------------------------------------------------------------

    def install(self, fresh: bool = False) -> None:
        """Start the registry: one full walk now, then the gc hook keeps it up to date.
        ``fresh``: started as ``import torch`` ended (attach's agent), when no tensor exists yet
        (torch's import makes none: checked on 2.13): no walk (16 ms over the 170k objects of
        the import); what is made from here on is young, and the hook or an inventory sees it."""
        if _GENERATIONAL and not self._hooked:
            gc.callbacks.append(self._hook)
            self._hooked = True
        if fresh and self._hooked and not self._refs:
            self._mark, self._mark_runs = [], _collections()  # what is tracked from here on
            self._freeze_count = gc.get_freeze_count()
            self._valid = True
            return
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

    def _unfrozen(self) -> bool:
        """Whether ``gc.unfreeze()`` emptied the frozen set into the oldest generation (frozen
        objects that die only lower its count). Reading the count walks the frozen list (16 ms
        for 170k objects): asked at inventories that follow a collection only, so an unfreeze is
        seen at the first inventory after one."""
        count = gc.get_freeze_count()
        back = count == 0 < self._freeze_count
        self._freeze_count = count
        return back

    def _young(self) -> list[Any]:
        """The tensors among the objects in the young generations. When no collection ran since
        the last call (a script that disabled the collector: generation 0 then holds everything
        made since, hundreds of thousands of objects), only those tracked after it: the ones
        before its mark were looked at then, and nothing joins generation 1 but by a collection.
        (A ``gc.freeze()`` moves the mark too: then all of the young generations.)"""
        runs = _collections()
        mark, marked_at = self._mark, self._mark_runs
        # the next walk's mark, made before this walk's list: an object made from here on (by
        # another thread too) is past it; a collection from here on voids it
        self._mark, self._mark_runs = [], runs
        out: list[Any] = []
        objects = gc.get_objects(0)  # oldest first: a newly tracked object joins the tail
        try:
            after = _after(objects, mark) if mark is not None and runs == marked_at else None
            self.since_mark = after is not None
            if after is not None:
                self.looked_at = len(after)
                out.extend(_pick_any(after))
                after.clear()
            else:
                out.extend(_pick_any(objects))
                older = gc.get_objects(1)
                self.looked_at = len(objects) + len(older)
                out.extend(_pick_any(older))
                older.clear()
        finally:
            objects.clear()
        return out

    # -- at an inventory -----------------------------------------------------------------------

    def tensors(self) -> list[Any]:
        """Every live tensor that has a Python object, oldest registered first. Strong
        references: the caller clears the list before it returns."""
        if not self._hooked or not self._valid or not any(cb is self._hook for cb in gc.callbacks):
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
        if not self.since_mark and self._unfrozen():
            young.clear()
            return self._full(tensor_types())
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
        # the next young walk's mark, before the list (see _young); the old one goes now (a
        # frozen one counts in the freeze count read below)
        self._mark, self._mark_runs = [], _collections()
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

"""What live autograd graphs keep alive: saved tensors and the graph nodes themselves.

Memory gc cannot see: a tensor saved for backward is not a Python object of its own, and after
``backward()`` the graph's saved tensors are freed but its nodes live on as long as something
holds the output (``total_loss += loss`` chains one more step's nodes each time, a few KiB per
step). For every live tensor with a ``grad_fn`` the reachable graph is walked, bounded by
``MAX_GRAPH_NODES`` over a whole inventory with one visited set, and charged to the tensor that
reaches it first (outermost roots first): the nodes, and the storages of saved tensors not
counted otherwise.

Saved tensors are read through ``node._raw_saved_*`` (``SavedTensor.data``): no unpack hook of the
script's (``save_on_cpu`` ...) runs, and a freed one answers ``None`` instead of raising. Node
wrappers seen are held until the walk ends so their ids stay unique; nothing is kept after.
"""

from __future__ import annotations

from typing import Any

import torch

from memscope.constants import NODE_BYTES
from memscope.agent.torchcompat.storages import extent_bytes, storage_address, storage_parts

MAX_GRAPH_NODES = 200_000  # autograd nodes walked per inventory, all graphs together
__all__ = ["GraphWalker", "MAX_GRAPH_NODES", "NODE_BYTES"]

_RAW_NAMES: dict[type, tuple[str, ...]] = {}
try:
    _SAVED_TENSOR: type | None = torch._C._autograd.SavedTensor
except AttributeError:  # pragma: no cover - older torch
    _SAVED_TENSOR = None


def saved_attr_names(node: Any) -> tuple[str, ...]:
    """The node's ``_raw_saved_*`` attributes: its saved variables as ``SavedTensor`` objects,
    whose ``data`` is the stored value, read without running a saved-tensors unpack hook (a
    script's ``save_on_cpu`` would copy back to the GPU). Cached per node class."""
    cls = type(node)
    names = _RAW_NAMES.get(cls)
    if names is None:
        try:
            names = tuple(n for n in dir(node) if n.startswith("_raw_saved_"))
        except Exception:
            names = ()
        _RAW_NAMES[cls] = names
    return names


class GraphWalker:
    """One inventory's walk over all live graphs (shared visited set)."""

    def __init__(self, excluded: set[int], alive: dict[int, Any] | None = None) -> None:
        self.excluded = excluded  # parameters, gradients, optimizer state: never graph bytes
        # storage address -> the live tensor counted for it (None: an optimizer's): a saved view
        # into one of these (a slice of the dataset) keeps nothing the live tensor does not
        self.alive = alive if alive is not None else {}
        self.charged: set[int] = set()  # storage addresses charged to some root
        self.visited: set[int] = set()
        self.keep: list[Any] = []  # node wrappers seen, so their ids stay unique
        self.nodes = 0
        self.truncated = False
        self.last_charged: list[int] = []  # storages the last walk() charged

    def inner(self, starts: list[Any]) -> set[int]:
        """ids of the nodes some other node of these graphs points to (bounded)."""
        inner: set[int] = set()
        seen: set[int] = set()
        todo = list(starts)
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            if len(seen) >= MAX_GRAPH_NODES:
                self.truncated = True
                break
            seen.add(id(node))
            self.keep.append(node)
            try:
                for nxt, _ in node.next_functions:
                    if nxt is not None:
                        inner.add(id(nxt))
                        if id(nxt) not in seen:
                            todo.append(nxt)
            except Exception:
                pass
        return inner

    def walk(self, fn: Any, own: int) -> tuple[int, int]:
        """(saved bytes, nodes) reachable from ``fn`` and not charged yet; ``own``: the root
        tensor's storage address (a node saving its own output charges nothing)."""
        total = 0
        nodes = 0
        self.last_charged = []
        todo = [fn]
        while todo:
            node = todo.pop()
            nid = id(node)
            if nid in self.visited:
                continue
            if self.nodes >= MAX_GRAPH_NODES:
                self.truncated = True
                break
            self.visited.add(nid)
            self.keep.append(node)
            self.nodes += 1
            if type(node).__name__ != "AccumulateGrad":
                # A parameter's AccumulateGrad is one node shared by every graph that uses the
                # parameter: charged to whichever root reached it first, it moved between the
                # step's live loss and a kept graph from one inventory to the next (36 nodes on
                # a tiny GPT: its leak rate 2% off at 60 steps). It is the parameter's, not a
                # step's: not counted.
                nodes += 1
            for name in saved_attr_names(node):
                try:
                    value = getattr(node, name)
                except Exception:
                    continue
                total += self._charge(value, own, 0)
                del value
            try:
                for nxt, _ in node.next_functions:
                    if nxt is not None and id(nxt) not in self.visited:
                        todo.append(nxt)
            except Exception:
                pass
        return total, nodes

    def _charge(self, value: Any, own: int, depth: int) -> int:
        tv = type(value)
        if tv is tuple or tv is list:
            return sum(self._charge(v, own, depth + 1) for v in value) if depth < 3 else 0
        if _SAVED_TENSOR is not None and tv is _SAVED_TENSOR:
            try:
                data = value.data  # the tensor, None once freed, or what a pack hook returned
            except Exception:
                return 0
            return self._charge(data, own, depth + 1) if data is not None and depth < 3 else 0
        if not issubclass(tv, torch.Tensor):  # type, not isinstance: a pack hook's own object
            return 0
        try:
            if value.layout is not torch.strided:  # sparse: its index and value storages
                total = 0
                for ptr, n in storage_parts(value):
                    if ptr != own and ptr not in self.excluded and ptr not in self.charged:
                        self.charged.add(ptr)
                        self.last_charged.append(ptr)
                        total += n
                return total
            s = value.untyped_storage()
            ptr = storage_address(s)
            if not ptr:
                return 0
            if ptr == own or ptr in self.excluded or ptr in self.charged:
                return 0
            nbytes = int(s.nbytes())
            if self.alive.get(ptr) is not None and extent_bytes(value) < nbytes:
                return 0  # a view into a live tensor's storage: counted with that tensor
            self.charged.add(ptr)
            self.last_charged.append(ptr)
            return nbytes
        except Exception:
            return 0

    def close(self) -> None:
        self.keep.clear()
        self.visited.clear()

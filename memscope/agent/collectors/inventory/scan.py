"""One tensor inventory: the live tensors counted per signature, at a step boundary.

Live tensors come from :class:`~memscope.agent.collectors.inventory.live.LiveTensors` (the registry, not a
walk over every object), deduplicated by storage and counted per *signature*
``(category, dtype, shape, device, requires_grad, grad_fn type)``. Categories, first match wins:
``parameters`` (``nn.Parameter`` or a tensor in an optimizer's param groups), ``gradients``
(their ``.grad``), ``optimizer_state`` (tensors in ``opt.state``), ``activations`` (has a
``grad_fn``), ``other``. Autograd graphs kept alive by a tensor add its group's ``graph_bytes``
(saved tensors) and ``graph_nodes`` (see :mod:`~memscope.agent.collectors.inventory.graph`).

For each signature in ``suspects`` a few of its tensors (the oldest and the newest) are handed
to the holder search before anything else is dropped.

Nothing survives the scan: tensors, lists of them and graph nodes are locals cleared on return;
only strings and numbers leave this module.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from memscope.agent.collectors.inventory.graph import GraphWalker
from memscope.agent.collectors.inventory.holders import find_holders
from memscope.agent.collectors.inventory.live import LiveTensors
from memscope.agent.collectors.inventory.preserved import preserved_refs
from memscope.agent.torchcompat.optimizer_state import optimizer_state_tensors
from memscope.agent.torchcompat.unseen import unseen
from memscope.agent.torchcompat.storages import storage_address

MAX_GROUPS = 2000  # groups written per inventory (largest first)
SAMPLES_PER_SUSPECT = 6  # instances of a suspect group handed to the holder search
GRAPH_SAMPLE = 16  # roots of one kind whose graphs an inventory walks (see _walk_graphs)

Signature = tuple[str, str, str, str, int, str | None]  # category, dtype, shape, device, rg, grad_fn


@dataclass
class Group:
    count: int = 0
    bytes: int = 0
    graph_bytes: int = 0
    graph_nodes: int = 0


@dataclass
class Inventory:
    groups: dict[Signature, Group] = field(default_factory=dict)
    tensors: int = 0
    bytes: int = 0
    graph_bytes: int = 0
    graph_nodes: int = 0
    duration_s: float = 0.0
    search_s: float = 0.0  # of which the holder search (suspects only)
    cpu_s: float = 0.0  # the training thread's CPU time for it, holder search excepted
    search_cpu_s: float = 0.0
    truncated: bool = False
    full: bool = False  # the tensors came from a walk over every object (else the registry)
    holders: dict[Signature, str | None] = field(default_factory=dict)


def _text_signature(raw: tuple[Any, ...]) -> Signature:
    category, dtype, shape, device, rg, fn = raw
    return (category, str(dtype).replace("torch.", ""), json.dumps(list(shape)), str(device),
            int(bool(rg)), fn.__name__ if fn is not None else None)


def signature(category: str, t: Any) -> Signature:
    fn = t.grad_fn
    return _text_signature((category, t.dtype, t.shape, t.device, t.requires_grad,
                            type(fn) if fn is not None else None))


def _storage(t: Any) -> tuple[int, int] | None:
    """(storage address, storage bytes) of a tensor with storage, else None. The address alone
    names a storage: host and CUDA devices share one virtual address space (UVA)."""
    try:
        ptr = storage_address(s := t.untyped_storage())
        if not ptr:  # meta (a FakeTensor too), empty
            return None
        return ptr, int(s.nbytes())
    except Exception:  # sparse, wrapper subclasses, fake tensors, freed storages
        return None


class _Counter:
    """Groups keyed by torch-level signatures (cheap to hash); text once per group."""

    def __init__(self, suspects: set[Signature] | frozenset[Signature]) -> None:
        self.groups: dict[tuple[Any, ...], Group] = {}
        self.suspects = suspects
        self.samples: dict[tuple[Any, ...], list[Any]] = {}

    def count(self, category: str, t: Any, nbytes: int, fn: Any) -> Group:
        raw = (category, t.dtype, t.shape, t.device, t.requires_grad, type(fn) if fn is not None else None)
        g = self.groups.get(raw)
        if g is None:
            g = self.new_group(raw)
        g.count += 1
        g.bytes += nbytes
        if self.samples:
            lst = self.samples.get(raw)
            if lst is not None:
                lst.append(t)
        return g

    def new_group(self, raw: tuple[Any, ...]) -> Group:
        g = self.groups[raw] = Group()
        if self.suspects and _text_signature(raw) in self.suspects:
            self.samples[raw] = []
        return g


def _from_optimizers(optimizers: Iterable[Any]) -> list[tuple[str, Any]]:
    """Parameters, their gradients and optimizer state, straight from the optimizers (a .grad
    need not have a Python object of its own, so the registry alone can miss it)."""
    params: list[Any] = []
    optimizers = list(optimizers)
    for opt in optimizers:
        for group in list(getattr(opt, "param_groups", [])):
            params.extend(p for p in group.get("params", []) if isinstance(p, torch.Tensor))
    state = optimizer_state_tensors(optimizers)
    out = [("parameters", p) for p in params]
    out.extend(("gradients", p.grad) for p in params if p.grad is not None)
    out.extend(("optimizer_state", v) for v in state)
    params.clear()
    state.clear()
    return out



@unseen
def take_inventory(live: LiveTensors | None, optimizers: Iterable[Any],
                   suspects: set[Signature] | frozenset[Signature] = frozenset(),
                   walk_graphs: bool = True, graph_saved: set[int] | frozenset[int] = frozenset()) -> Inventory:
    """Scan the live tensors (``live=None``: a one-off registry, i.e. a full walk). For each
    signature in ``suspects``, also look for who holds one of its tensors (``Inventory.holders``).
    ``graph_saved``: ids of tensor objects a saved-tensors hook gave autograd (the layer
    profiler's aliases): held by their graph, they are not live unless something else holds them."""
    t0 = time.perf_counter()
    c0 = time.thread_time()
    # The scan makes a tuple or two per tensor: with the collector on, that many allocations
    # trigger collections that traverse the whole process (half the cost at 100k tensors).
    # Collections wait until the scan is over (re-enabled in the finally below).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        inv = _take(live, optimizers, suspects, walk_graphs, t0, graph_saved)
        inv.cpu_s = max(time.thread_time() - c0 - inv.search_cpu_s, 0.0)
        return inv
    finally:
        if gc_was_enabled:
            gc.enable()


def _take(live: LiveTensors | None, optimizers: Iterable[Any],
          suspects: set[Signature] | frozenset[Signature], walk_graphs: bool, t0: float,
          graph_saved: set[int] | frozenset[int]) -> Inventory:
    inv = Inventory()
    if live is None:
        live = LiveTensors()
    counter = _Counter(suspects)
    seen: set[int] = set()
    rows: list[tuple[int, int, Any, Any, Any]] = []  # storage address, bytes, tensor, grad_fn, group
    known = _from_optimizers(optimizers)
    tensors = live.tensors()
    inv.full = live.last_full
    param_type = torch.nn.Parameter
    tensor_type = torch.Tensor
    picked: dict[Signature, list[Any]] = {}
    s: Any = None
    try:
        for category, t in known:
            st = _storage(t)
            if st is None or st[0] in seen:
                continue
            try:
                counter.count(category, t, st[1], t.grad_fn)
            except Exception:
                continue
            seen.add(st[0])
        known.clear()
        fixed = set(seen)  # parameters, gradients, optimizer state: never charged to a graph
        append = rows.append
        # objects torch preserved for tensors only a graph holds (preserved.py): not live
        limit = preserved_refs() or 0
        refcount = sys.getrefcount
        for t in tensors:  # the hot loop (every live tensor): inline, about a microsecond each
            try:
                if refcount(t) <= limit and (t._use_count() > 1 or (graph_saved and id(t) in graph_saved)):
                    continue  # only its graph holds it (a hook's alias: one Python reference, autograd's)
                s = t.untyped_storage()
                # a subclass may be a FakeTensor (meta storage: asking its data pointer warns)
                tt = type(t)
                ptr = s.data_ptr() if tt is tensor_type or tt is param_type else storage_address(s)
                if not ptr:  # meta, empty
                    continue
                if ptr in seen:
                    continue
                seen.add(ptr)
                if type(t) is param_type:
                    counter.count("parameters", t, int(s.nbytes()), t.grad_fn)
                    fixed.add(ptr)
                else:  # its group read once, here: the graph walk's kinds and the count share it
                    fn = t.grad_fn
                    append((ptr, s.nbytes(), t, fn,
                            ("other", t.dtype, t.shape, t.device, t.requires_grad, None) if fn is None else
                            ("activations", t.dtype, t.shape, t.device, t.requires_grad, type(fn))))
            except Exception:  # sparse, wrapper subclasses, fake tensors: not counted
                continue
        del s
        tensors.clear()
        charged, graph_keys = _walk_graphs(rows, fixed, seen, inv) if walk_graphs else ({}, set())
        groups, samples = counter.groups, counter.samples
        for key, nbytes, t, _fn, raw in rows:  # counter.count inlined: the second hot loop
            if key in graph_keys and key not in charged:
                continue  # saved by a live graph: in its root's graph_bytes
            g = groups.get(raw)
            if g is None:
                g = counter.new_group(raw)
            g.count += 1
            g.bytes += nbytes
            if samples:
                lst = samples.get(raw)
                if lst is not None:
                    lst.append(t)
            extra = charged.get(key)
            if extra:
                g.graph_bytes += extra[0]
                g.graph_nodes += extra[1]
                inv.graph_bytes += extra[0]
                inv.graph_nodes += extra[1]
        rows.clear()
        picked = {_text_signature(raw): _pick(lst) for raw, lst in counter.samples.items()}
        counter.samples.clear()
        for raw, g in counter.groups.items():
            sig = _text_signature(raw)
            prev = inv.groups.get(sig)
            if prev is None:
                inv.groups[sig] = g
            else:  # two torch-level signatures with one text (shouldn't happen): merge
                prev.count += g.count
                prev.bytes += g.bytes
                prev.graph_bytes += g.graph_bytes
                prev.graph_nodes += g.graph_nodes
        counter.groups.clear()
    finally:
        tensors.clear()
        rows.clear()
        known.clear()
        counter.samples.clear()
    inv.tensors = sum(g.count for g in inv.groups.values())
    inv.bytes = sum(g.bytes for g in inv.groups.values())
    for sig in suspects:
        inv.holders[sig] = None
    if picked:
        t_search = time.perf_counter()
        c_search = time.thread_time()
        try:
            inv.holders.update(find_holders(picked))  # type: ignore[arg-type]
            inv.search_s = time.perf_counter() - t_search
            inv.search_cpu_s = time.thread_time() - c_search
        finally:
            for lst in picked.values():
                lst.clear()
            picked.clear()
    if len(inv.groups) > MAX_GROUPS:
        keep = sorted(inv.groups.items(), key=lambda kv: -(kv[1].bytes + kv[1].graph_bytes))[:MAX_GROUPS]
        inv.groups = dict(keep)
        inv.truncated = True
    inv.duration_s = time.perf_counter() - t0
    return inv


def _pick(lst: list[Any]) -> list[Any]:
    """The oldest and the newest few (registry order: a leaked one is likely among the oldest,
    the newest shows the container that is still growing)."""
    half = SAMPLES_PER_SUSPECT // 2
    picked = lst[:half] + lst[-half:] if len(lst) > SAMPLES_PER_SUSPECT else list(lst)
    lst.clear()
    return picked


def _walk_graphs(rows: list[tuple[int, int, Any, Any, Any]], fixed: set[int], live: set[int],
                 inv: Inventory) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """Saved bytes and nodes per root storage; storages saved by some graph. Outermost roots
    (grad_fns no other live graph reaches) are walked first.

    A leak that keeps a graph per step (``cache[step] = logits``) has as many roots of one kind
    as steps so far: walking them all makes each inventory cost more than the last. Of a kind
    (shape, dtype, grad_fn type) with more than ``GRAPH_SAMPLE`` roots, a spread sample is walked
    and, unless those graphs save tensors that are alive in Python too, the rest are charged the
    sample's median of saved bytes and nodes (roots of one kind are the same code's graphs; a
    chain whose newest root reaches every older one charges the older ones nothing, and so does
    the median). Graphs that save live tensors are all walked: those tensors must be found in
    them, not counted again on their own. ``live``: storages of every live tensor seen (``fixed``
    among them, which the walker never charges)."""
    roots = [(key, raw, fn) for key, _, _, fn, raw in rows if fn is not None]
    if not roots:
        return {}, set()
    kinds: dict[tuple[Any, ...], list[tuple[int, Any]]] = {}
    for key, raw, fn in roots:  # a kind: one group (grad_fn type, shape, dtype, device)
        kinds.setdefault(raw, []).append((key, fn))
    roots.clear()
    walked: list[tuple[int, Any, int]] = []  # key, grad_fn, kind (index into ``rest``, or -1)
    rest: list[tuple[list[tuple[int, Any]], list[int]]] = []  # (not walked, keys walked) per big kind
    for members in kinds.values():
        if len(members) <= GRAPH_SAMPLE:
            walked.extend((k, fn, -1) for k, fn in members)
            continue
        idx = sorted({round(i * (len(members) - 1) / (GRAPH_SAMPLE - 1)) for i in range(GRAPH_SAMPLE)})
        chosen = set(idx)
        walked.extend((*members[i], len(rest)) for i in idx)
        rest.append(([m for i, m in enumerate(members) if i not in chosen], [members[i][0] for i in idx]))
    kinds.clear()
    walker = GraphWalker(fixed)
    charged: dict[int, tuple[int, int]] = {}

    saves_live = [0] * len(rest)  # roots of a big kind's sample that saved a live tensor

    def walk(key: int, fn: Any) -> bool:
        """Walk one root; whether it saved a live tensor's storage."""
        try:
            b, n = walker.walk(fn, key)
        except Exception:
            return False
        if b or n:
            pb, pn = charged.get(key, (0, 0))
            charged[key] = (pb + b, pn + n)
        return any(p in live for p in walker.last_charged)

    try:
        inner = walker.inner([fn for _, fn, _ in walked])
        # top roots first (stable); a big kind is inner when one of its sample is (the relu outputs
        # that leaked losses' graphs save are reached from the sampled losses, not from the rest)
        inner_kind = [False] * len(rest)
        for _, fn, kind in walked:
            if kind >= 0 and id(fn) in inner:
                inner_kind[kind] = True
        walked.sort(key=lambda r: inner_kind[r[2]] if r[2] >= 0 else id(r[1]) in inner)
        inner.clear()
        walker.keep.clear()  # the walk below keeps what it visits itself
        left = [len(sample) for _, sample in rest]  # sampled roots of each big kind not walked yet
        for key, fn, kind in walked:
            if walker.truncated:
                break
            saved_live = walk(key, fn)
            if kind < 0:
                continue
            saves_live[kind] += saved_live
            left[kind] -= 1
            if left[kind]:
                continue
            others, sample = rest[kind]
            if 2 * saves_live[kind] > len(sample):
                # the sample's graphs each save tensors of their own that are alive in Python too
                # (retain_graph, or no backward yet; not one weight they all save): all of the
                # kind are walked now, before inner roots, so that those tensors are counted in
                # their graphs, not on their own (exact)
                for k, f in others:
                    if walker.truncated:
                        break
                    walk(k, f)
                continue
            got = [charged.get(k, (0, 0)) for k in sample]
            b = int(_median([g[0] for g in got]))
            n = int(_median([g[1] for g in got]))
            if b or n:
                for k, _ in others:
                    pb, pn = charged.get(k, (0, 0))
                    charged[k] = (pb + b, pn + n)
        inv.truncated = inv.truncated or walker.truncated
        return charged, set(walker.charged)
    finally:
        walked.clear()
        rest.clear()
        walker.close()


def _median(values: list[int]) -> float:
    """statistics.median, without importing statistics (fractions and decimal come with it: a
    cost at the agent's start inside the user's import of torch)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

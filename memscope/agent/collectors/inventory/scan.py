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
from memscope.agent.torchcompat.storages import dtype_text, storage_address, storage_parts

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


def _dtype(t: Any) -> Any:
    """The dtype a group is keyed by: torch's for a strided tensor, ``"float32 sparse_coo"`` for
    one of another layout (its group is not its dense twin's)."""
    return t.dtype if t.layout is torch.strided else dtype_text(t)


def signature(category: str, t: Any) -> Signature:
    fn = t.grad_fn
    return _text_signature((category, _dtype(t), t.shape, t.device, t.requires_grad,
                            type(fn) if fn is not None else None))


def _storages(t: Any) -> list[tuple[int, int]]:
    """(storage address, storage bytes) of each storage holding a tensor's memory (a sparse
    tensor's indices and values), [] when none. The address alone names a storage: host and
    CUDA devices share one virtual address space (UVA)."""
    try:
        return storage_parts(t)  # meta (a FakeTensor too) and empty storages: none
    except Exception:  # wrapper subclasses, fake tensors, freed storages
        return []


class _Slot:
    """One group while the scan runs: its counts, its graph roots (for the walk) and, for a
    suspect, the tensors the holder search may pick from. Slots, not a dataclass: the hot loop
    touches two of these per tensor."""

    __slots__ = ("count", "bytes", "graph_bytes", "graph_nodes", "roots", "samples", "sampled",
                 "median_charged")

    def __init__(self, sampled: bool) -> None:
        self.count = 0
        self.bytes = 0
        self.graph_bytes = 0
        self.graph_nodes = 0
        self.roots: list[tuple[int, Any]] = []  # (storage address, grad_fn) of its tensors with a graph
        self.samples: list[Any] | None = [] if sampled else None
        self.sampled: set[int] = set()  # roots walked for a median (a kind of many roots)
        self.median_charged: set[int] = set()  # roots not walked, charged the sample's median


def _raw(t: Any) -> tuple[Any, ...]:
    """The torch-level signature the hot loop computes inline (tensors other than parameters)."""
    fn = t.grad_fn
    if fn is None:
        return ("other", _dtype(t), t.shape, t.device, t.requires_grad, None)
    return ("activations", _dtype(t), t.shape, t.device, True, type(fn))


class _Counter:
    """Groups keyed by torch-level signatures (cheap to hash); text once per group."""

    def __init__(self, suspects: set[Signature] | frozenset[Signature]) -> None:
        self.slots: dict[tuple[Any, ...], _Slot] = {}
        self.suspects = suspects

    def count(self, category: str, t: Any, nbytes: int) -> None:
        fn = t.grad_fn
        raw = (category, _dtype(t), t.shape, t.device, t.requires_grad, type(fn) if fn is not None else None)
        s = self.slots.get(raw) or self.new_slot(raw)
        s.count += 1
        s.bytes += nbytes
        if s.samples is not None:
            s.samples.append(t)

    def new_slot(self, raw: tuple[Any, ...]) -> _Slot:
        s = self.slots[raw] = _Slot(bool(self.suspects) and _text_signature(raw) in self.suspects)
        return s


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
    slots = counter.slots
    new_slot = counter.new_slot
    seen: dict[int, Any] = {}  # storage address -> the tensor counted for it (None: an optimizer's)
    known = _from_optimizers(optimizers)
    tensors = live.tensors()
    inv.full = live.last_full
    param_type = torch.nn.Parameter
    tensor_type = torch.Tensor
    picked: dict[Signature, list[Any]] = {}
    s: Any = None
    try:
        for category, t in known:
            parts = [p for p in _storages(t) if p[0] not in seen]
            if not parts:
                continue
            try:
                counter.count(category, t, sum(n for _, n in parts))
            except Exception:
                continue
            for ptr, _ in parts:
                seen[ptr] = None
        known.clear()
        fixed = set(seen)  # parameters, gradients, optimizer state: never charged to a graph
        fixed_add = fixed.add
        # objects torch preserved for tensors only a graph holds (preserved.py): not live
        limit = preserved_refs() or 0
        refcount = sys.getrefcount
        # The hot loop (every live tensor): inline, about a microsecond each, nearly all of it
        # torch's getters; each tensor is counted here, once (graph-saved ones are taken back
        # after the walk, rarely).
        for t in tensors:
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
                nbytes = s.nbytes()
                seen[ptr] = t
                if tt is param_type:
                    fn = None
                    raw: tuple[Any, ...] = ("parameters", t.dtype, t.shape, t.device, t.requires_grad, None)
                    fixed_add(ptr)
                else:  # a graph's output requires grad: not asked
                    fn = t.grad_fn
                    raw = (("other", t.dtype, t.shape, t.device, t.requires_grad, None) if fn is None else
                           ("activations", t.dtype, t.shape, t.device, True, type(fn)))
                slot = slots.get(raw) or new_slot(raw)
                slot.count += 1
                slot.bytes += nbytes
                if fn is not None:
                    slot.roots.append((ptr, fn))
                if slot.samples is not None:
                    slot.samples.append(t)
            except Exception:  # another layout (sparse), wrapper subclasses, fake tensors
                if t.layout is not torch.strided:
                    _count_layout(t, seen, slots, new_slot)
                continue
        del s
        if walk_graphs:
            _uncount_saved(_walk_graphs(_in_first_seen_order(slots), fixed, seen, inv), seen, slots)
        picked = {_text_signature(raw): _pick(sl.samples) for raw, sl in slots.items() if sl.samples is not None}
        for raw, sl in slots.items():
            sl.roots.clear()
            sig = _text_signature(raw)
            g = inv.groups.get(sig)
            if g is None:
                g = inv.groups[sig] = Group()
            # two torch-level signatures with one text (shouldn't happen): merged
            g.count += sl.count
            g.bytes += sl.bytes
            g.graph_bytes += sl.graph_bytes
            g.graph_nodes += sl.graph_nodes
        slots.clear()
    finally:
        tensors.clear()
        known.clear()
        seen.clear()
        for sl in slots.values():
            sl.roots.clear()
            if sl.samples is not None:
                sl.samples.clear()
        slots.clear()
    inv.tensors = sum(g.count for g in inv.groups.values())
    inv.bytes = sum(g.bytes for g in inv.groups.values())
    inv.graph_bytes = sum(g.graph_bytes for g in inv.groups.values())
    inv.graph_nodes = sum(g.graph_nodes for g in inv.groups.values())
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


# Kinds with graphs, in the order inventories first met them: a node two kinds' graphs share is
# charged to the kind walked first, so kinds are walked in one order at every inventory, not the
# order gc or the registry lists their tensors (a kept output and a helper's local made from one
# hidden layer: the charge swung between them and the local's leak dropped out of 1 run in 8). The
# kind met first is most often the loop's own, made every step. Bounded: a run with thousands of
# shapes walks the rest in the order of each scan.
_FIRST_SEEN: dict[tuple[Any, ...], int] = {}
MAX_ORDERED_KINDS = 10_000


def forget_kinds() -> None:
    """At the agent's stop: the order goes (it names grad_fn classes, a script's own Functions'
    among them, which a detached process should not find memscope still holding)."""
    _FIRST_SEEN.clear()


def _in_first_seen_order(slots: dict[tuple[Any, ...], _Slot]) -> list[_Slot]:
    """The slots with graph roots, kinds met in an earlier inventory first, in that order."""
    kinds = [(raw, sl) for raw, sl in slots.items() if sl.roots]
    for raw, _ in kinds:
        if raw not in _FIRST_SEEN and len(_FIRST_SEEN) < MAX_ORDERED_KINDS:
            _FIRST_SEEN[raw] = len(_FIRST_SEEN)
    kinds.sort(key=lambda k: _FIRST_SEEN.get(k[0], MAX_ORDERED_KINDS))
    return [sl for _, sl in kinds]


def _count_layout(t: Any, seen: dict[int, Any], slots: dict[tuple[Any, ...], _Slot], new_slot: Any) -> None:
    """A tensor of another layout than strided (sparse COO, CSR ...; rare, so off the hot
    path): its index and value storages, each storage once, in a group of its layout."""
    try:
        parts = [p for p in storage_parts(t) if p[0] not in seen]
        if not parts:
            return
        for ptr, _ in parts:
            seen[ptr] = t
        raw = _raw(t)
        slot = slots.get(raw) or new_slot(raw)
        slot.count += 1
        slot.bytes += sum(n for _, n in parts)
        if raw[5] is not None:
            slot.roots.append((parts[0][0], t.grad_fn))
        if slot.samples is not None:
            slot.samples.append(t)
    except Exception:
        return


def _uncount_saved(saved: tuple[set[int], set[int]], seen: dict[int, Any],
                   slots: dict[tuple[Any, ...], _Slot]) -> None:
    """Take back the live tensors a walked graph saved (they are in that root's graph_bytes),
    unless the tensor is itself a root charged a graph: its own walk's, or its kind's median.
    ``saved``: (storages the walk charged, roots whose own walk charged something). Rare at a
    step boundary (``retain_graph``; an evaluation without ``no_grad`` whose input is still
    held), so the hot loop does not prepare for it: the few tensors' signatures are read again."""
    charged, kept = saved
    for ptr in charged:
        if ptr in kept:
            continue
        t = seen.get(ptr)
        if t is None:  # not live in Python, or an optimizer's (never charged)
            continue
        try:
            raw = _raw(t)
            sl = slots[raw]
            nbytes = sum(n for _, n in _storages(t))
        except Exception:
            continue
        if raw[5] is not None and ptr in sl.median_charged:
            continue  # a root charged the median of its kind's sample
        sl.count -= 1
        sl.bytes -= nbytes
        if sl.samples is not None:
            sl.samples[:] = [x for x in sl.samples if x is not t]
        if sl.count <= 0:
            del slots[raw]


def _pick(lst: list[Any]) -> list[Any]:
    """The oldest and the newest few (registry order: a leaked one is likely among the oldest,
    the newest shows the container that is still growing)."""
    half = SAMPLES_PER_SUSPECT // 2
    picked = lst[:half] + lst[-half:] if len(lst) > SAMPLES_PER_SUSPECT else list(lst)
    lst.clear()
    return picked


def _walk_graphs(slots: list[_Slot], fixed: set[int], live: dict[int, Any],
                 inv: Inventory) -> tuple[set[int], set[int]]:
    """Charge each group its roots' saved bytes and nodes; return (storages saved by some graph,
    roots whose own walk charged something). Outermost roots (grad_fns no other live graph
    reaches) are walked first.

    A leak that keeps a graph per step (``cache[step] = logits``) has as many roots of one kind
    as steps so far: walking them all makes each inventory cost more than the last. Of a kind
    (one group: shape, dtype, grad_fn type) with more than ``GRAPH_SAMPLE`` roots, a spread
    sample is walked and, unless those graphs save tensors that are alive in Python too, the
    rest are charged the sample's median of saved bytes and nodes (roots of one kind are the
    same code's graphs; a chain whose newest root reaches every older one charges the older
    ones nothing, and so does the median). Graphs that save live tensors are all walked: those
    tensors must be found in them, not counted again on their own. ``live``: storages of every
    live tensor seen (``fixed`` among them, which the walker never charges)."""
    walked: list[tuple[int, Any, _Slot, int]] = []  # key, grad_fn, its group, kind (index into ``rest``, or -1)
    rest: list[tuple[_Slot, list[int]]] = []  # (the group, sample indices) per big kind
    for sl in slots:
        members = sl.roots
        if len(members) <= GRAPH_SAMPLE:
            walked.extend((k, fn, sl, -1) for k, fn in members)
            continue
        idx = sorted({round(i * (len(members) - 1) / (GRAPH_SAMPLE - 1)) for i in range(GRAPH_SAMPLE)})
        walked.extend((*members[i], sl, len(rest)) for i in idx)
        sl.sampled = {members[i][0] for i in idx}
        rest.append((sl, idx))
    walker = GraphWalker(fixed, live)
    kept: set[int] = set()
    # a big kind's sampled roots: what each walk charged, and whether another graph had reached
    # the root's node before its own walk
    own: dict[int, tuple[int, int, bool]] = {}
    shadow: set[int] = set()  # nodes near the top of graphs charged a median without a walk

    def walk(key: int, fn: Any, sl: _Slot) -> bool:
        """Walk one root, charge its group; whether it saved a live tensor's storage."""
        if id(fn) in shadow:  # under a root charged its kind's median: charged there
            own[key] = (0, 0, True)
            return False
        reached = id(fn) in walker.visited
        try:
            b, n = walker.walk(fn, key)
        except Exception:
            return False
        if b or n:
            sl.graph_bytes += b
            sl.graph_nodes += n
            kept.add(key)
        own[key] = (b, n, reached)
        return any(p in live for p in walker.last_charged)

    saves_live = [0] * len(rest)  # roots of a big kind's sample that saved a live tensor
    try:
        inner = walker.inner([fn for _, fn, _, _ in walked])
        # top roots first (stable); a big kind is inner when one of its sample is (the relu outputs
        # that leaked losses' graphs save are reached from the sampled losses, not from the rest)
        inner_kind = [False] * len(rest)
        for _, fn, _, kind in walked:
            if kind >= 0 and id(fn) in inner:
                inner_kind[kind] = True
        # and within a big inner kind, its roots no other graph reaches first (a chain of hidden
        # states, each saved by the next: the newest's walk holds them all, none counted twice)
        walked.sort(key=lambda r: (inner_kind[r[3]] if r[3] >= 0 else id(r[1]) in inner, id(r[1]) in inner))
        inner.clear()
        walker.keep.clear()  # the walk below keeps what it visits itself
        left = [len(idx) for _, idx in rest]  # sampled roots of each big kind not walked yet
        for key, fn, sl, kind in walked:
            if walker.truncated:
                break
            saved_live = walk(key, fn, sl)
            if kind < 0:
                continue
            saves_live[kind] += saved_live
            left[kind] -= 1
            if left[kind]:
                continue
            _, idx = rest[kind]
            if 2 * saves_live[kind] > len(idx):
                # the sample's graphs each save tensors of their own that are alive in Python too
                # (retain_graph, or no backward yet; not one weight they all save): all of the
                # kind are walked now, before inner roots, so that those tensors are counted in
                # their graphs, not on their own (exact)
                for k, f in sl.roots:
                    if walker.truncated:
                        break
                    if k not in sl.sampled:
                        walk(k, f, sl)
                continue
            # the rest are charged the median of the sampled roots no other graph had reached;
            # a root that some walked graph reaches is charged nothing (its nodes were charged
            # where they were reached: the older links of a chain, or a kind's tensors that
            # another group's graphs use, beside ones that no graph uses)
            got = [g for g in (own.get(k, (0, 0, True)) for k in sl.sampled) if not g[2]]
            b = int(_median([g[0] for g in got])) if got else 0
            n = int(_median([g[1] for g in got])) if got else 0
            visited = walker.visited
            charged = [(k, f) for k, f in sl.roots
                       if k not in sl.sampled and id(f) not in visited and id(f) not in shadow]
            if charged and not got and len(charged) <= GRAPH_SAMPLE:
                # every sampled root was reached by another graph, and a few unsampled ones were
                # not (the loop's own tensor of a kind a traceback keeps many of): no median to
                # charge them, so they are walked, each, exactly
                for k, f in charged:
                    if walker.truncated:
                        break
                    walk(k, f, sl)
                continue
            if b or n:
                sl.median_charged = {k for k, _ in charged}
                sl.graph_bytes += b * len(charged)
                sl.graph_nodes += n * len(charged)
                # the top of the graphs charged so (not walked): a root of an inner kind there is
                # in the median already (a helper's argument under the product made from it)
                _mark_below([f for _, f in charged], shadow, walker)
        inv.truncated = inv.truncated or walker.truncated
        return set(walker.charged), kept
    finally:
        walked.clear()
        rest.clear()
        own.clear()
        walker.close()


SHADOW_DEPTH = 4  # levels below a root charged its kind's median that are marked as reached


def _mark_below(fns: list[Any], shadow: set[int], walker: GraphWalker) -> None:
    """Mark the nodes within ``SHADOW_DEPTH`` levels under ``fns`` (not the roots themselves)
    as reached: an unwalked root found there later is charged nothing, nor is a node there that
    a later walk comes to, its nodes being in the median of the root above it. Wrappers are
    kept by the walker, so their ids stay theirs."""
    level = list(fns)
    for _ in range(SHADOW_DEPTH):
        nxt: list[Any] = []
        for fn in level:
            try:
                children = fn.next_functions
            except Exception:
                continue
            for child, _ in children:
                if child is not None and id(child) not in shadow and id(child) not in walker.visited:
                    shadow.add(id(child))
                    # and a later walk stops there: another group's graph that shares the node
                    # (an output made from the same hidden layer) must not charge it again
                    walker.visited.add(id(child))
                    walker.keep.append(child)
                    nxt.append(child)
        level = nxt
        if not level:
            break


def _median(values: list[int]) -> float:
    """statistics.median, without importing statistics (fractions and decimal come with it: a
    cost at the agent's start inside the user's import of torch)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

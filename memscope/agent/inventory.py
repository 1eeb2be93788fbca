"""Tensor inventories at step boundaries, and who holds a suspect group.

An inventory is one ``gc.get_objects()`` walk on the training thread (at a step boundary, every
``inventory_every`` steps). Live tensors are picked out by ``type(o)`` against the set of
``torch.Tensor`` subclasses (never ``isinstance`` on arbitrary objects: some lazy proxies answer
``__class__`` with side effects), deduplicated by storage, and counted per *signature*
``(category, dtype, shape, device, requires_grad, grad_fn type)``.

Categories, first match wins: ``parameters`` (``nn.Parameter`` or a tensor in an optimizer's
param groups), ``gradients`` (their ``.grad``), ``optimizer_state`` (tensors in ``opt.state``),
``activations`` (has a ``grad_fn``), ``other``.

Memory gc cannot see: tensors saved by a live autograd graph (``loss_history.append(loss)``
keeps the whole graph) are not Python objects. For every live tensor with a ``grad_fn`` the
reachable graph is walked (bounded by ``MAX_GRAPH_NODES`` over the whole scan, a shared visited
set) and the storages of its saved tensors (``_saved_*`` node attributes) not counted otherwise
are charged to the tensor's group as ``graph_bytes``, once (the first root in gc order that
reaches a storage gets it).

Nothing survives the scan: the object list, the tensors and graph nodes are locals dropped on
return; only strings and numbers leave this module.

``find_holder`` answers "who holds it" for one object: a bounded, level-by-level
``gc.get_referrers`` search up to a named root (a module global, a class attribute, an instance
attribute path), falling back to the local variables of the training thread's frames.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from memscope.constants import WARMUP_STEPS

MAX_GRAPH_NODES = 200_000  # autograd nodes walked per inventory, all graphs together
MAX_GROUPS = 2000  # groups written per inventory (largest first)
SAMPLES_PER_SUSPECT = 6  # instances of a suspect group tried by the holder search

Signature = tuple[str, str, str, str, int, str | None]  # category, dtype, shape, device, rg, grad_fn


@dataclass
class Group:
    count: int = 0
    bytes: int = 0
    graph_bytes: int = 0


@dataclass
class Inventory:
    groups: dict[Signature, Group] = field(default_factory=dict)
    tensors: int = 0
    bytes: int = 0
    graph_bytes: int = 0
    duration_s: float = 0.0
    truncated: bool = False
    holders: dict[Signature, str | None] = field(default_factory=dict)


def _tensor_types() -> set[type]:
    out = {torch.Tensor}
    todo = [torch.Tensor]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def _key(t: Any) -> tuple[int, int, int] | None:
    """(device index, storage address, storage bytes) of a tensor with storage, else None."""
    try:
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr == 0:  # meta, empty
            return None
        return (t.get_device(), ptr, s.nbytes())
    except Exception:  # sparse, wrapper subclasses, fake tensors, freed storages
        return None


def _raw_signature(category: str, t: Any) -> tuple[Any, ...]:
    """Cheap hashable signature (torch objects); ``signature`` turns it into strings once per group."""
    fn = t.grad_fn
    return (category, t.dtype, t.shape, t.device, t.requires_grad, type(fn) if fn is not None else None)


def _text_signature(raw: tuple[Any, ...]) -> Signature:
    category, dtype, shape, device, rg, fn = raw
    return (category, str(dtype).replace("torch.", ""), json.dumps(list(shape)), str(device),
            int(bool(rg)), fn.__name__ if fn is not None else None)


def signature(category: str, t: Any) -> Signature:
    return _text_signature(_raw_signature(category, t))


_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def _foreign_saved_hooks() -> bool:
    """Whether saved-tensor hooks (the script's: save_on_cpu, ...) are active now."""
    try:
        return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
    except Exception:
        return True


def _saved_names(node: Any) -> tuple[str, ...]:
    """Attributes of an autograd node that unpack its saved tensors: ``_saved_*`` on built-in
    nodes, ``saved_tensors`` on custom ``autograd.Function`` nodes."""
    cls = type(node)
    names = _SAVED_NAMES.get(cls)
    if names is None:
        try:
            names = tuple(n for n in dir(node) if n.startswith("_saved_") or n == "saved_tensors")
        except Exception:
            names = ()
        _SAVED_NAMES[cls] = names
    return names


class _GraphWalker:
    """Saved-tensor bytes reachable from grad_fns, over one inventory (shared visited set)."""

    def __init__(self, excluded: set[tuple[Any, int]]) -> None:
        self.excluded = excluded  # parameters, gradients, optimizer state: never graph bytes
        self.charged: set[tuple[Any, int]] = set()  # storages charged to some root
        self.visited: set[int] = set()
        # Python wrappers of graph nodes can be freed and their ids reused as soon as nothing
        # holds them: every node seen is held here until the scan ends, so ids stay unique
        self.keep: list[Any] = []
        self.nodes = 0
        self.truncated = False

    def children(self, starts: list[Any]) -> set[int]:
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

    def walk(self, fn: Any, own: tuple[Any, int]) -> int:
        total = 0
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
            for name in _saved_names(node):
                try:
                    value = getattr(node, name)
                except Exception:  # freed after backward (no retain_graph): nothing held
                    continue
                total += self._charge(value, own)
                del value
            try:
                for nxt, _ in node.next_functions:
                    if nxt is not None and id(nxt) not in self.visited:
                        todo.append(nxt)
            except Exception:
                pass
        return total

    def _charge(self, value: Any, own: tuple[Any, int]) -> int:
        if type(value) in (tuple, list):
            return sum(self._charge(v, own) for v in value)
        if not isinstance(value, torch.Tensor):  # from autograd: a tensor, an int, None ...
            return 0
        k = _key(value)
        if k is None:
            return 0
        sk = (k[0], k[1])
        if sk == own or sk in self.excluded or sk in self.charged:
            return 0
        self.charged.add(sk)
        return k[2]


def take_inventory(optimizers: Iterable[Any], suspects: set[Signature] | frozenset[Signature] = frozenset(),
                   walk_graphs: bool = True) -> Inventory:
    """Scan the live tensors. For each signature in ``suspects``, also look for who holds one
    of its tensors (``Inventory.holders``)."""
    t0 = time.perf_counter()
    inv = Inventory()
    ttypes = _tensor_types()
    param_type = torch.nn.Parameter

    # known parameters, their gradients and optimizer state, straight from the optimizers
    # (a .grad need not have a Python object, so gc alone can miss it)
    cat_of: dict[tuple[Any, int], str] = {}
    extra: list[tuple[str, Any]] = []
    params: list[Any] = []
    opt_state: list[Any] = []
    for opt in list(optimizers):
        for group in list(getattr(opt, "param_groups", [])):
            params.extend(p for p in group.get("params", []) if isinstance(p, torch.Tensor))
        for state in list(getattr(opt, "state", {}).values()):
            if isinstance(state, dict):
                opt_state.extend(v for v in list(state.values()) if isinstance(v, torch.Tensor))
    for p in params:
        k = _key(p)
        if k is not None:
            cat_of.setdefault((k[0], k[1]), "parameters")
            extra.append(("parameters", p))
    for p in params:
        g = p.grad
        if g is not None:
            k = _key(g)
            if k is not None:
                cat_of.setdefault((k[0], k[1]), "gradients")
                extra.append(("gradients", g))
    for v in opt_state:
        k = _key(v)
        if k is not None:
            cat_of.setdefault((k[0], k[1]), "optimizer_state")
            extra.append(("optimizer_state", v))
    del params, opt_state

    seen: set[tuple[Any, int]] = set()
    samples: dict[Signature, list[Any]] = {s: [] for s in suspects}

    raw_groups: dict[tuple[Any, ...], Group] = {}
    raw_samples: dict[tuple[Any, ...], list[Any]] = {}

    def count(cat: str, t: Any, k: tuple[Any, int, int]) -> Group:
        raw = _raw_signature(cat, t)
        g = raw_groups.get(raw)
        if g is None:
            g = raw_groups[raw] = Group()
            sig = _text_signature(raw)
            if sig in samples:
                raw_samples[raw] = samples[sig]
        g.count += 1
        g.bytes += k[2]
        if raw_samples:
            lst = raw_samples.get(raw)
            if lst is not None:
                lst.append(t)
        return g

    for cat, t in extra:
        k = _key(t)
        if k is not None and (k[0], k[1]) not in seen:
            try:
                count(cat_of.get((k[0], k[1]), cat), t, k)
            except Exception:
                continue
            seen.add((k[0], k[1]))
    del extra
    fixed = set(seen)  # parameters, gradients, optimizer state: never charged to a graph
    live: list[tuple[tuple[int, int, int], Any, bool]] = []  # key, tensor, has grad_fn
    objects = gc.get_objects()
    try:
        for o in objects:
            if type(o) in ttypes:
                k = _key(o)
                if k is None or (k[0], k[1]) in seen:
                    continue
                try:
                    if type(o) is param_type:
                        count("parameters", o, k)
                        fixed.add((k[0], k[1]))
                    else:
                        live.append((k, o, o.grad_fn is not None))
                except Exception:  # a subclass whose attributes misbehave: not counted
                    continue
                seen.add((k[0], k[1]))
        o = None
    finally:
        del objects

    # autograd graphs kept alive: saved tensors charged to the outermost live tensor whose graph
    # holds them ("top" roots: grad_fns no other live graph reaches), then to inner ones
    charged: dict[tuple[int, int], int] = {}
    if walk_graphs and _foreign_saved_hooks():
        walk_graphs = False  # unpacking a saved tensor would run the script's unpack hook
    if walk_graphs:
        roots = [(k, t) for k, t, has_fn in live if has_fn]
        if roots:
            walker = _GraphWalker(fixed)
            inner = walker.children([t.grad_fn for _, t in roots])
            roots.sort(key=lambda kt: id(kt[1].grad_fn) in inner)  # stable: top roots first
            for k, t in roots:
                if walker.truncated:
                    break
                try:
                    b = walker.walk(t.grad_fn, (k[0], k[1]))
                except Exception:
                    b = 0
                if b:
                    charged[(k[0], k[1])] = charged.get((k[0], k[1]), 0) + b
            inv.truncated = walker.truncated
            graph_keys = walker.charged
            walker.keep.clear()
            del walker, inner
        else:
            graph_keys = set()
        del roots
    else:
        graph_keys = set()
    for k, t, has_fn in live:
        sk = (k[0], k[1])
        if sk in graph_keys and sk not in charged:
            continue  # saved by a live graph: in its root's graph_bytes
        try:
            g = count("activations" if has_fn else "other", t, k)
        except Exception:
            continue
        b = charged.get(sk)
        if b:
            g.graph_bytes += b
            inv.graph_bytes += b
    live.clear()
    del live
    raw_samples.clear()
    for raw, g in raw_groups.items():
        sig = _text_signature(raw)
        prev = inv.groups.get(sig)
        if prev is None:
            inv.groups[sig] = g
        else:  # two torch-level signatures with one text (shouldn't happen): merge
            prev.count += g.count
            prev.bytes += g.bytes
            prev.graph_bytes += g.graph_bytes
    raw_groups.clear()
    inv.tensors = sum(g.count for g in inv.groups.values())
    inv.bytes = sum(g.bytes for g in inv.groups.values())

    for sig, lst in samples.items():
        if lst:
            # the youngest and the oldest few instances: a leaked one is likely among the oldest
            picked = lst[:SAMPLES_PER_SUSPECT // 2] + lst[-(SAMPLES_PER_SUSPECT // 2):] \
                if len(lst) > SAMPLES_PER_SUSPECT else list(lst)
            lst.clear()
            inv.holders[sig] = _holder_of_any(picked)
            picked.clear()
            del picked
        else:
            inv.holders[sig] = None
    samples.clear()
    del samples

    if len(inv.groups) > MAX_GROUPS:
        keep = sorted(inv.groups.items(), key=lambda kv: -(kv[1].bytes + kv[1].graph_bytes))[:MAX_GROUPS]
        inv.groups = dict(keep)
        inv.truncated = True
    inv.duration_s = time.perf_counter() - t0
    return inv


def _holder_of_any(candidates: list[Any]) -> str | None:
    """The first named root found for any candidate; a frame local only when none has one."""
    fallback = None
    while candidates:
        obj = candidates.pop(0)
        try:
            name, from_frame = find_holder(obj)
        except Exception:
            name, from_frame = None, False
        del obj
        if name is not None and not from_frame:
            return name
        fallback = fallback or name
    return fallback


# -- who holds it ------------------------------------------------------------------------------

MAX_DEPTH = 8  # levels of referrers walked up (an instance's __dict__ is a level of its own)
MAX_OBJECTS = 400  # referrers examined per search
_ATTR_DICTS = ("_modules", "_parameters", "_buffers")  # nn.Module's named containers


def find_holder(target: Any) -> tuple[str | None, bool]:
    """A name that keeps ``target`` alive: ``module.global``, ``module.Class.attr``,
    ``module.global.attr.attr`` (instance attributes, nn.Module children by name), or, when no
    such root is found, ``module.function.<locals>.name`` from the training thread's frames
    (second value True). Lists, tuples, sets and dict values are walked through without a name for their
    index. Bounded: MAX_DEPTH levels, MAX_OBJECTS referrers."""
    modules: dict[int, str] = {}
    for mname, mod in list(sys.modules.items()):
        d = getattr(mod, "__dict__", None) if isinstance(mod, types.ModuleType) else None
        if type(d) is dict and (id(d) not in modules or mname == "__main__"):
            modules[id(d)] = mname  # __main__ wins over its aliases (__mp_main__)
    # path[id(obj)] = (obj, suffix): how obj leads down to target, as name parts
    path: dict[int, tuple[Any, tuple[str, ...]]] = {}
    own: set[int] = {id(path), id(modules)}

    def add(obj: Any, suffix: tuple[str, ...]) -> None:
        entry = (obj, suffix)
        own.add(id(entry))
        path[id(obj)] = entry

    add(target, ())
    frontier: list[Any] = [target]
    examined = 0
    try:
        for _ in range(MAX_DEPTH):
            if not frontier:
                break
            args = tuple(frontier)
            own.add(id(args))
            own.add(id(frontier))
            referrers = gc.get_referrers(*args)
            own.add(id(referrers))
            fids = {id(o) for o in args}
            nxt: list[Any] = []
            for r in referrers:
                rid = id(r)
                if rid in own or rid in path or type(r) is types.FrameType:
                    continue
                examined += 1
                if examined > MAX_OBJECTS:
                    break
                found = _step(r, fids, path, modules)
                if found is None:
                    continue
                kind, value = found
                if kind == "name":
                    return value, False
                add(r, value)
                nxt.append(r)
            referrers.clear()
            del referrers, args, r
            frontier.clear()
            frontier = nxt
            if examined > MAX_OBJECTS:
                break
        return _from_frames(path), True
    finally:
        frontier.clear()
        path.clear()


def _render(parts: tuple[str, ...]) -> str:
    return "".join(f"[{p[1:]!r}]" if p.startswith(_KEY) else "" if p.startswith(_ITEM) else p
                   for p in parts)


_KEY = "\x00"  # a str dict key whose dict's owner is not known yet: ['k'], or .k for a __dict__
_ITEM = "\x01"  # an entry of the holding container: nothing, or .k for a __dict__


def _step(r: Any, fids: set[int], path: dict[int, tuple[Any, tuple[str, ...]]],
          modules: dict[int, str]) -> tuple[str, Any] | None:
    """One referrer: ("name", full name) when it is a named root, ("walk", suffix) to keep
    walking up from it, None for a dead end."""
    tr = type(r)
    if tr is dict:
        for k, v in list(r.items()):
            if id(v) in fids:
                suffix = path[id(v)][1]
                mname = modules.get(id(r))
                if mname is not None and isinstance(k, str):
                    return "name", f"{mname}.{k}{_render(suffix)}"
                if isinstance(v, torch.Tensor) or not isinstance(k, str):
                    # the dict holding the tensor, or keyed by step / id: the dict is the holder
                    # (unless the dict turns out to be an instance's __dict__: then k is a name)
                    return "walk", (_ITEM + (k if isinstance(k, str) else ""),) + suffix
                return "walk", (_KEY + k,) + suffix
        return None
    if tr in (list, tuple, set, frozenset) or tr.__name__ == "deque":
        for v in r:
            if id(v) in fids:
                return "walk", path[id(v)][1]
        return None
    if isinstance(r, type):  # a class, reached through its __dict__
        try:
            d = type.__dict__["__dict__"].__get__(r)
        except Exception:
            return None
        for cid in fids:
            child, suffix = path[cid]
            if type(child) is dict and suffix and suffix[0].startswith(_KEY) \
                    and child.get(suffix[0][1:], _MISSING) is not _MISSING \
                    and d.get(suffix[0][1:], _MISSING) is child.get(suffix[0][1:]):
                return "name", f"{r.__module__}.{r.__qualname__}{_render(_attrs(suffix))}"
        return None
    if tr in (types.FunctionType, types.MethodType, types.CellType, types.CodeType,
              types.ModuleType, types.GeneratorType) or isinstance(r, torch.Tensor):
        return None
    try:
        d = object.__getattribute__(r, "__dict__")
    except Exception:
        return None
    if type(d) is not dict:
        return None
    if id(d) in fids:  # came up through the instance's __dict__: its keys are attributes
        return "walk", _attrs(path[id(d)][1])
    for k, v in list(d.items()):
        if id(v) in fids:  # inline attribute values: the instance refers to them directly
            return "walk", _attrs((_KEY + k,) + path[id(v)][1])
    return None


_MISSING = object()
_FOLD = tuple(f".{a}" for a in ("_modules", "_parameters", "_buffers"))  # nn.Module containers


def _attrs(suffix: tuple[str, ...]) -> tuple[str, ...]:
    """The first part is an attribute (``.k``); nn.Module's ``._modules`` / ``._parameters`` /
    ``._buffers`` followed by a key become that key as an attribute (``.fc2``)."""
    if not suffix or not suffix[0].startswith((_KEY, _ITEM)) or len(suffix[0]) < 2:
        return suffix
    first = "." + suffix[0][1:]
    rest = suffix[1:]
    if first in _FOLD and rest and rest[0].startswith(_KEY):
        return ("." + rest[0][1:],) + rest[1:]
    return (first,) + rest


_CO_OPTIMIZED = 0x0001  # a function's frame: f_locals is a snapshot, not the namespace


def _frame_locals(frame: Any) -> list[tuple[str, Any]]:
    """A frame's local variables. Before Python 3.13, ``frame.f_locals`` of a function frame is
    a dict snapshot stored on the frame: it would keep every local it saw alive (a tensor the
    script deletes afterwards) until something refreshes it. It is emptied right after reading.
    That is safe: whatever writes a snapshot back to the frame (a tracer's return, a debugger)
    refreshes it from the frame first; a snapshot the script holds itself (``locals()``) is left
    alone. Module and class frames' f_locals is their namespace: read only."""
    d = frame.f_locals
    items = list(d.items())
    # 3 references: the frame's, ``d`` and getrefcount's argument. More: the script holds
    # that very dict (``l = locals()``): emptying it would change what the script sees.
    if sys.version_info < (3, 13) and frame.f_code.co_flags & _CO_OPTIMIZED and type(d) is dict \
            and d is not frame.f_globals and sys.getrefcount(d) <= 3:
        d.clear()
    return items


def _from_frames(path: dict[int, tuple[Any, tuple[str, ...]]]) -> str | None:
    """A local variable of the calling thread's frames (outside memscope and torch) that holds
    an object of the path: ``module.function.<locals>.name``."""
    try:
        frame: Any = sys._getframe(1)
    except Exception:
        return None
    try:
        while frame is not None:
            g = frame.f_globals.get("__name__", "")
            if isinstance(g, str) and not g.startswith(("memscope", "torch")):
                try:
                    local_items = _frame_locals(frame)
                except Exception:
                    local_items = []
                for name, v in local_items:
                    entry = path.get(id(v))
                    if entry is not None and entry[0] is v:
                        code = frame.f_code
                        qual = getattr(code, "co_qualname", code.co_name)
                        where = f"{g}.{qual}.<locals>.{name}" if qual != "<module>" else f"{g}.{name}"
                        return where + _render(entry[1])
                local_items.clear()
            frame = frame.f_back
        return None
    finally:
        del frame


class InventoryCollector:
    """Inventories on chosen steps, with a short per-group history that marks suspects: a group
    that grew at each of the last two inventories after warm-up (one fewer than the report's
    verdict needs, so the holder is known by the time the verdict is) gets a holder search on
    the next inventory, once."""

    HISTORY = 8

    def __init__(self, every: int, budget: float = 0.0) -> None:
        self.every = every
        self.budget = budget
        # the next step due: under a time budget, start where the verdict starts looking
        # (earlier inventories only show warm-up growth); an exact cadence starts at step 0
        self._next = WARMUP_STEPS if budget > 0 else 0
        self._history: dict[Signature, list[tuple[int, int, int]]] = {}
        self._steps: list[int] = []
        self._suspects: set[Signature] = set()
        self._searched: set[Signature] = set()
        self.new_suspects: set[Signature] = set()  # marked by the last ``take``

    def due(self, step: int) -> bool:
        return self.every > 0 and step >= self._next

    def schedule(self, step: int, cost_s: float, step_s: float) -> None:
        """After an inventory at ``step`` that took ``cost_s``: the next is ``every`` steps on,
        or further when that would spend more than ``budget`` of the time on inventories
        (``step_s``: a recent step's duration)."""
        interval = self.every
        if self.budget > 0 and step_s > 0:
            interval = max(interval, math.ceil(cost_s / (self.budget * step_s)))
        self._next = step + interval

    def take(self, step: int, optimizers: Iterable[Any]) -> Inventory:
        suspects = set(self._suspects)
        self.new_suspects = set()
        inv = take_inventory(optimizers, suspects)
        self._suspects -= suspects
        self._searched |= suspects
        self._steps = (self._steps + [step])[-self.HISTORY:]
        for sig, g in inv.groups.items():
            self._history.setdefault(sig, [])
        for sig in list(self._history):
            g = inv.groups.get(sig)
            h = self._history[sig]
            h.append((step, (g.bytes + g.graph_bytes) if g else 0, g.count if g else 0))
            del h[:-self.HISTORY]
            if len(h) >= 3 and all(p[1] == 0 for p in h[-3:]):
                del self._history[sig]  # gone for good: forget it
                continue
            post = [p for p in h[-3:] if p[0] >= WARMUP_STEPS]
            if sig not in self._searched and len(post) == 3 and post[0][1] < post[1][1] < post[2][1]:
                if sig not in self._suspects:
                    self.new_suspects.add(sig)  # the runtime arms creation-site capture for it
                self._suspects.add(sig)
        if len(self._history) > 4 * MAX_GROUPS:  # churning shapes: keep the largest
            keep = sorted(self._history.items(), key=lambda kv: -kv[1][-1][1])[:MAX_GROUPS]
            self._history = dict(keep)
        return inv

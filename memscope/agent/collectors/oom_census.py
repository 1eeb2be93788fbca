"""What was live when an out-of-memory error struck: an emergency census, bounded in time.

Called by :mod:`memscope.agent.collectors.oom` while the exception is still in flight (the failing step's
frames, and the autograd graph they hold, are alive). It counts the tensors on the failing device
by unique storage, in this order of categories (first match wins):

* ``parameters``: the optimizers' parameters, the root models' parameters, any ``nn.Parameter``;
* ``gradients``: their ``.grad``;
* ``optimizer_state``: tensors in any optimizer's ``state`` (also one that never stepped);
* ``activations``: tensors saved for backward by the autograd graphs of live tensors (read from
  the graph nodes' raw saved variables, never through an unpack hook), and live tensors with a
  ``grad_fn``: "activations saved so far" in a forward, what backward has not freed yet in a
  backward;
* ``other``: every other live tensor (the batch the script holds, buffers, caches).

Activations are attributed to modules when the failing step's module calls were logged (a
:class:`CallLog`, kept while the OOM hooks are armed): each graph node's sequence number falls
inside the innermost logged call that was running when autograd created it.

It is an emergency: memory is exhausted. It allocates little (one ``gc.get_objects()`` list, a
few sets of integers), stops at ``MAX_SECONDS`` or ``MAX_NODES`` (the result then says
``truncated``), and keeps nothing: every tensor, node and frame it touched is a local dropped on
return; only numbers and names leave it. It never raises.
"""

from __future__ import annotations

import bisect
import gc
import time
import weakref
from typing import Any, Iterable

from memscope.agent.collectors.inventory.graph import saved_attr_names
from memscope.agent.torchcompat.optimizer_state import optimizer_state_tensors
from memscope.agent.torchcompat.unseen import unseen
from memscope.agent.torchcompat.storages import storage_address, storage_parts

MAX_SECONDS = 3.0  # wall time for the whole census (typically tens of milliseconds)
MAX_NODES = 400_000  # autograd graph nodes walked
MAX_CALLS = 200_000  # module calls logged per step (CallLog)
TOP_MODULES = 15  # modules kept in ``activations_by_module``
OUTSIDE = "(outside modules)"
_CHUNK = 65536  # gc objects filtered between two looks at the clock
_INF = float("inf")


class CallLog:
    """The module calls of the step in progress on one thread, as autograd sequence ranges.

    ``enter`` / ``leave`` run in the armed global module hooks: one integer read
    (``torch._C._autograd._get_sequence_nr()``: the number the next graph node will get) and a
    list append. Entries hold the module's id and type name, never the module.
    """

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.types: list[str] = []
        self.starts: list[int] = []
        self.ends: list[float] = []
        self.parents: list[int] = []
        self.stack: list[int] = []
        self.full = False

    def enter(self, module: Any, seq: int) -> None:
        if len(self.ids) >= MAX_CALLS:
            self.full = True
            self.stack.append(-1)
            return
        self.stack.append(len(self.ids))
        self.parents.append(self.stack[-2] if len(self.stack) > 1 else -1)
        self.ids.append(id(module))
        self.types.append(type(module).__name__)
        self.starts.append(seq)
        self.ends.append(_INF)

    def leave(self, seq: int) -> None:
        if self.stack:
            i = self.stack.pop()
            if i >= 0:
                self.ends[i] = seq

    def call_of(self, seq: int) -> int:
        """Index of the innermost call that was running when node ``seq`` was made, else -1."""
        i = bisect.bisect_right(self.starts, seq) - 1
        while i >= 0 and not seq < self.ends[i]:
            i = self.parents[i]
        return i


def _subclasses(root: type) -> set[type]:
    out: set[type] = {root}
    todo: list[type] = [root]
    while todo:
        sub: type
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def _types(torch: Any) -> tuple[set[type], set[type], type]:
    """Tensor classes, optimizer classes (looked up by ``type(o) in``: no isinstance on
    arbitrary objects), and nn.Parameter."""
    return _subclasses(torch.Tensor), _subclasses(torch.optim.Optimizer), torch.nn.Parameter


def _stored(raw: Any) -> list[Any]:
    """What a SavedTensor (or a list of them) stores: the tensor, or the tensors inside what a
    pack hook returned (one level deep)."""
    out: list[Any] = []
    for r in raw if isinstance(raw, (tuple, list)) else (raw,):
        try:
            d = r.data
        except Exception:  # freed by a backward that already ran (no retain_graph)
            continue
        if isinstance(d, (tuple, list)):
            out.extend(d)
        else:
            out.append(d)
    return out


class _Counter:
    """Unique storages on one device, by category."""

    def __init__(self, device: int, cuda: bool, torch: Any) -> None:
        self.device = device  # -1: CPU
        self.cuda = cuda
        self.seen: set[int] = set()
        self.bytes = {"parameters": 0, "gradients": 0, "optimizer_state": 0, "activations": 0, "other": 0}
        self.tensors = 0
        self.tensor_type = torch.Tensor
        self.strided = torch.strided
        self.attention_scores = 0  # saved N x N score tensors (softmax, dropout, scores @ v)

    def key(self, t: Any) -> tuple[int, int] | None:
        """(storage address, bytes) of a tensor on our device, else None."""
        try:
            if self.cuda:
                if not t.is_cuda or t.get_device() != self.device:
                    return None
            elif t.device.type != "cpu":
                return None
            if t.layout is not self.strided:  # sparse: its index and value storages, as one
                parts = storage_parts(t)
                return (parts[0][0], sum(n for _, n in parts)) if parts else None
            s = t.untyped_storage()
            ptr = storage_address(s)
            if ptr == 0:
                return None
            return ptr, int(s.nbytes())
        except Exception:  # fake, wrapper subclasses, freed storages
            return None

    def claim(self, ptr: int, nbytes: int, category: str) -> None:
        if ptr not in self.seen:
            self.seen.add(ptr)
            self.bytes[category] += nbytes
            self.tensors += 1

    def add(self, category: str, t: Any) -> int:
        """Count ``t`` in ``category`` unless its storage is counted already; its bytes if new."""
        if not isinstance(t, self.tensor_type):
            return 0
        k = self.key(t)
        if k is None or k[0] in self.seen:
            return 0
        self.seen.add(k[0])
        self.bytes[category] += k[1]
        self.tensors += 1
        return k[1]



@unseen
def census(device: str, optimizers: Iterable[Any], roots: Iterable[tuple[Any, str]],
           log: CallLog | None = None, max_seconds: float = MAX_SECONDS) -> dict[str, Any] | None:
    """The live tensor bytes on ``device`` ("cpu" or "cuda:N") by category, and the activations
    by module when ``log`` covers the failing step. ``roots``: (root module, name prefix)."""
    try:
        import torch

        return _census(torch, device, list(optimizers), list(roots), log, max_seconds)
    except Exception:  # a MemoryError or RecursionError included: the OOM record goes on
        return None


def _census(torch: Any, device: str, optimizers: list[Any], roots: list[tuple[Any, str]],
            log: CallLog | None, max_seconds: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    deadline = t0 + max_seconds
    cuda = device.startswith("cuda")
    index = int(device.split(":")[1]) if cuda and ":" in device else (0 if cuda else -1)
    c = _Counter(index, cuda, torch)
    truncated = False
    ttypes, otypes, param_type = _types(torch)

    # 1. model states, straight from the optimizers and the root models (a .grad need not have
    #    a Python object of its own; optimizer state tensors are found through the optimizer)
    params: list[Any] = []
    for opt in optimizers:
        for group in list(getattr(opt, "param_groups", [])):
            params.extend(group.get("params", []))
    for root, _prefix in roots:
        try:
            params.extend(root.parameters())
        except Exception:
            pass
    live: list[Any] = []  # tensors found by gc: not model states
    wanted = ttypes | otypes
    objects = gc.get_objects()
    try:
        for start in range(0, len(objects), _CHUNK):
            if time.perf_counter() > deadline:
                truncated = True
                break
            for o in [o for o in objects[start:start + _CHUNK] if type(o) in wanted]:
                cls = type(o)
                if cls in otypes:
                    if all(o is not x for x in optimizers):
                        optimizers.append(o)  # built, never stepped (yet): its state still counts
                elif cls is param_type or issubclass(cls, param_type):
                    params.append(o)
                else:
                    live.append(o)
        o = None
    finally:
        del objects
    for p in params:
        c.add("parameters", p)
    for p in params:
        try:
            g = p.grad
        except Exception:
            g = None
        if g is not None:
            c.add("gradients", g)
    for v in optimizer_state_tensors(optimizers):
        c.add("optimizer_state", v)
    del params, optimizers

    # 2. the autograd graphs of the live tensors: what they saved for backward
    by_call: dict[int, int] = {}
    starts = [t.grad_fn for t in live if _grad_fn(t) is not None]
    nodes, hit_limit = _walk(starts, c, by_call, log, deadline)
    truncated = truncated or hit_limit
    del starts

    # 3. the live tensors themselves
    _count_live(live, c, by_call, log)
    live.clear()
    del live
    out: dict[str, Any] = dict(c.bytes)
    out["tensors"] = c.tensors
    out["attention_scores"] = c.attention_scores
    out["graph_nodes"] = nodes
    out["truncated"] = truncated
    out["seconds"] = round(time.perf_counter() - t0, 4)
    out["activations_by_module"] = _by_module(by_call, log, roots) if log is not None else None
    return out


def _count_live(live: list[Any], c: _Counter, by_call: dict[int, int], log: CallLog | None) -> None:
    for t in live:
        fn = _grad_fn(t)
        if fn is None:
            c.add("other", t)
            continue
        b = c.add("activations", t)
        if b and log is not None:
            _charge(by_call, log, fn, b)


def _grad_fn(t: Any) -> Any:
    try:
        return t.grad_fn
    except Exception:
        return None


def _seq(node: Any) -> int | None:
    try:
        return int(node._sequence_nr())
    except Exception:
        return None


def _charge(by_call: dict[int, int], log: CallLog, node: Any, nbytes: int) -> None:
    seq = _seq(node)
    i = log.call_of(seq) if seq is not None else -1
    by_call[i] = by_call.get(i, 0) + nbytes


def _walk(starts: list[Any], c: _Counter, by_call: dict[int, int], log: CallLog | None,
          deadline: float) -> tuple[int, bool]:
    """Saved tensors reachable from ``starts``, counted as activations (bounded). A storage
    several nodes saved is charged once, to its first saver (the lowest sequence number), as the
    layer profiler charges it: a layer's output saved by the next layer and by itself is the
    first one's."""
    visited: set[int] = set()
    keep: list[Any] = []  # node wrappers held until the end: their ids stay unique
    todo = list(starts)
    saved: dict[int, list[Any]] = {}  # storage address -> [bytes, first saver's sequence number]
    scores: set[int] = set()  # storage addresses of attention score tensors
    nodes = 0
    truncated = False
    try:
        while todo:
            node = todo.pop()
            if id(node) in visited:
                continue
            if nodes >= MAX_NODES or (not nodes % 1024 and time.perf_counter() > deadline):
                truncated = True
                break
            visited.add(id(node))
            keep.append(node)
            nodes += 1
            seq = None
            for name in saved_attr_names(node):
                try:
                    values = _stored(getattr(node, name))
                except Exception:
                    continue
                for v in values:
                    k = c.key(v) if isinstance(v, c.tensor_type) else None
                    if k is None or k[0] in c.seen:
                        continue
                    if seq is None:
                        seq = _seq(node)
                    entry = saved.get(k[0])
                    if entry is None:
                        saved[k[0]] = [k[1], seq]
                        if _is_score(node, v):
                            scores.add(k[0])
                    elif seq is not None and (entry[1] is None or seq < entry[1]):
                        entry[1] = seq
                del values
            try:
                for nxt, _ in node.next_functions:
                    if nxt is not None and id(nxt) not in visited:
                        todo.append(nxt)
            except Exception:
                pass
        node = None
    finally:
        todo.clear()
        keep.clear()
    for ptr, (nbytes, seq) in saved.items():
        if ptr in scores and ptr not in c.seen:
            c.attention_scores += nbytes
        c.claim(ptr, nbytes, "activations")
        if log is not None:
            i = log.call_of(seq) if seq is not None else -1
            by_call[i] = by_call.get(i, 0) + nbytes
    return nodes, truncated


# autograd nodes that save attention scores (B x heads x N x N): the softmax, its dropout, the
# masking and scaling, and the scores @ v matmul
_SCORE_NODES = ("Softmax", "LogSoftmax", "NativeDropout", "Dropout", "Bmm", "Baddbmm", "MaskedFill",
                "Mul", "Div", "Where", "Matmul", "UnsafeView", "Expand")
MIN_SCORE_SIDE = 16  # N x N smaller than this is not a sequence's attention


def _is_score(node: Any, v: Any) -> bool:
    """A saved tensor that looks like attention scores: square in its last two dimensions
    (N x N, at least MIN_SCORE_SIDE), with batch or head dimensions before, saved by a node that
    attention's softmax, dropout or matmul make."""
    try:
        shape = v.shape
        return (len(shape) >= 3 and shape[-1] == shape[-2] >= MIN_SCORE_SIDE
                and type(node).__name__.startswith(_SCORE_NODES))
    except Exception:
        return False


def _by_module(by_call: dict[int, int], log: CallLog, roots: list[tuple[Any, str]]) -> list[dict[str, Any]]:
    """The activations per module name (the call's module), most first, at most TOP_MODULES
    (the rest summed into one ``(other modules)`` entry)."""
    names: dict[int, str] = {}
    for root, prefix in roots:
        try:
            target = getattr(root, "_orig_mod", root) if type(root).__name__ == "OptimizedModule" else root
            names.setdefault(id(root), prefix.rstrip(":"))
            for name, mod in target.named_modules(remove_duplicate=False):
                names.setdefault(id(mod), prefix + name if name else prefix.rstrip(":"))
        except Exception:
            continue
    total: dict[str, list[Any]] = {}
    for i, b in by_call.items():
        if i < 0:
            key, kind = OUTSIDE, None
        else:
            key = names.get(log.ids[i], f"<{log.types[i]}>")
            kind = log.types[i]
        entry = total.setdefault(key, [0, kind])
        entry[0] += b
    rows = sorted(total.items(), key=lambda kv: (-kv[1][0], kv[0]))
    out = [{"module": k, "type": v[1], "bytes": v[0]} for k, v in rows[:TOP_MODULES]]
    rest = sum(v[0] for _, v in rows[TOP_MODULES:])
    if rest:
        out.append({"module": "(other modules)", "type": None, "bytes": rest})
    return out


def weak_roots(refs: Iterable[weakref.ReferenceType[Any]]) -> list[Any]:
    """The modules behind ``refs`` that are still alive."""
    return [m for m in (r() for r in refs) if m is not None]

"""The tensors autograd saves for backward on a profiled step: counted once per storage, alive.

A ``torch.autograd.graph.saved_tensors_hooks`` pair is entered on the training thread. Its pack
hook counts every tensor saved, deduplicated by storage (a storage already saved and still alive
counts once, for its first saver), and hands each new storage to ``charge``, which says which
module saved it. Storages of the parameters and buffers of the models seen are not activations.

The pack hook returns a detached alias of its argument (same storage and version counter, no
``grad_fn``: returning the tensor itself would tie an output saved by its own grad_fn into a
reference cycle gc cannot see, so a graph the script keeps could never be freed) and keeps only
a weak reference to that alias: the reference dies when autograd frees the saved tensor, which
also gives the live saved bytes (``max_live``, the activations at their peak in the step).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Callable

import torch

from memscope.agent.collectors.layers.kernels import sdpa_kernel
from memscope.agent.collectors.layers.tensors import storage_key
from memscope.agent.torchcompat.storages import extent_bytes, storage_parts
from memscope.agent.torchcompat.compiled import runtime_only
from memscope.agent.torchcompat.unseen import unseen

StorageKey = tuple[int, int]


class SavedTensors:
    """The pack / unpack pair and the live saved storages. ``active`` says whether the step is
    still profiled; ``charge(key, nbytes)`` attributes a newly saved storage (raising there
    returns the tensor itself, uncounted: as any failure inside the hook); ``on_unpack`` hears
    that a backward uses what was saved; ``on_kernel(name)`` that the tensor came from an
    attention kernel of scaled_dot_product_attention (:mod:`.kernels`)."""

    def __init__(self, active: Callable[[], bool], charge: Callable[[StorageKey, int], None],
                 on_unpack: Callable[[], None], on_kernel: Callable[[str], None] | None = None) -> None:
        self._active = active
        self._charge = charge
        self._on_unpack = on_unpack
        self._on_kernel = on_kernel
        self._ctx: Any = None
        self._thread: int | None = None
        self._lock = threading.Lock()
        self._not_activations: set[StorageKey] = set()  # the models' parameters and buffers
        # live saved storages: key -> [alias count, nbytes]; weakrefs keep their callbacks alive
        self._live: dict[StorageKey, list[int]] = {}
        self._refs: set[weakref.ReferenceType[Any]] = set()
        # every alias still saved, past the end of its step (a graph the script keeps): for the
        # inventory, which must not take them for loose tensors; emptied as they die
        self._aliases: dict[int, weakref.ReferenceType[Any]] = {}
        self.live_bytes = 0
        self.max_live = 0

    def reset(self) -> None:
        self._not_activations = set()
        self._live = {}
        self._refs = set()
        self.live_bytes = self.max_live = 0

    def add_model(self, root: Any) -> None:
        """The parameter and buffer storages of a model seen (every profiled step: they move)."""
        for t in list(root.parameters()) + list(root.buffers()):
            try:
                self._not_activations.add(storage_key(t))
            except Exception:
                pass

    def install(self) -> str | None:
        """Enter the hooks on this thread; why not, when they cannot be."""
        try:
            self._drop_own_stale_hooks()
            if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
                # The script's own hooks (save_on_cpu, say) are active: pushing ours on top
                # would switch theirs off. Count calls and outputs only.
                return "the script has its own saved-tensors hooks active"
            ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            ctx.__enter__()
            self._ctx = ctx
            self._thread = threading.get_ident()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    @property
    def installed(self) -> bool:
        return self._ctx is not None

    def _drop_own_stale_hooks(self) -> None:
        """Pop our own hooks left on this thread's stack by a step that ended on another thread
        (a loop that moved from a worker thread to the main thread): they are not the script's."""
        for _ in range(8):  # one per profiled step that ended elsewhere, at most; bounded anyway
            top = torch._C._autograd._top_saved_tensors_default_hooks(False)
            if top is None or top[0] != self._pack:
                return
            torch._C._autograd._pop_saved_tensors_default_hooks()

    def remove(self) -> None:
        if self._ctx is not None:
            if self._thread == threading.get_ident():
                try:
                    self._ctx.__exit__(None, None, None)
                except Exception:
                    pass
            # else: another thread cannot pop the training thread's hook; ours stays there
            # inactive (the pack hook returns at once when not active)
            self._ctx = None
            self._thread = None

    def remove_if_top(self) -> None:
        """Leave the hooks now when they are on top of this thread's stack (a step whose rest is
        not profiled); under the script's own they stay, inert, until :meth:`remove`."""
        if self._ctx is None or self._thread != threading.get_ident():
            return
        try:
            top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        except Exception:
            return
        if top is not None and top[0] == self._pack:
            self.remove()

    def forget(self) -> None:
        """End of the step: dropping the weakrefs drops their callbacks (``max_live`` stays)."""
        self._live = {}
        self._refs = set()

    @unseen
    @runtime_only
    def _unpack(self, t: Any) -> Any:
        self._on_unpack()  # a backward is using what was saved
        return t

    @unseen
    @runtime_only
    def _pack(self, t: Any) -> Any:
        if not self._active():
            return t
        try:
            key, nbytes = _saved_key(t)
            if key[1] == 0 or key in self._not_activations:
                return t
            if self._on_kernel is not None:
                kernel = sdpa_kernel(t)
                if kernel is not None:
                    self._on_kernel(kernel)
            cb = self._released(key)
            # Autograd keeps what the pack hook returns. Returning ``t`` itself would make an
            # output saved by its own grad_fn (relu, exp, ...) hold its graph through its
            # Python object: a reference cycle gc cannot see, so a graph the script keeps
            # (``losses.append(loss)``) could never be freed. A detached alias (same storage
            # and version counter, no grad_fn) has no such cycle; it dies with the graph.
            saved = t.detach()
            ref = weakref.ref(saved, cb)
            self._aliases[id(saved)] = weakref.ref(saved, self._alias_gone(id(saved)))
            with self._lock:
                self._refs.add(ref)
                entry = self._live.get(key)
                if entry is not None:
                    entry[0] += 1
                    return saved
                self._live[key] = [1, nbytes]
                self.live_bytes += nbytes
                if self.live_bytes > self.max_live:
                    self.max_live = self.live_bytes
            self._charge(key, nbytes)
            return saved
        except Exception:
            pass
        return t

    def alias_ids(self) -> set[int]:
        """ids of the aliases ``_pack`` returned that autograd still keeps."""
        return {k for k, ref in list(self._aliases.items()) if ref() is not None}

    def _alias_gone(self, key: int) -> Callable[[Any], None]:
        aliases = self._aliases

        def gone(_ref: Any) -> None:
            aliases.pop(key, None)
        return gone

    @runtime_only
    def _released(self, key: StorageKey) -> Callable[[Any], None]:
        def callback(ref: Any) -> None:
            try:
                with self._lock:
                    self._refs.discard(ref)
                    entry = self._live.get(key)
                    if entry is None:
                        return
                    entry[0] -= 1
                    if entry[0] <= 0:
                        del self._live[key]
                        self.live_bytes -= entry[1]
            except Exception:
                pass
        return callback


def _saved_key(t: Any) -> tuple[StorageKey, int]:
    """The key a saved tensor is counted under, and what the graph keeps by saving it.

    * A strided tensor: its storage, whole (``storage_key``).
    * A view that needs no gradient into a storage a tensor alive outside the graph holds (the
      batch's indices sliced from the whole token tensor, ``data[i:i + n]``): only its own
      extent, keyed by where it starts. The storage is alive anyway; a copy of the slice is what
      saving it costs (on a GPU, ``.to(device)`` makes that copy). Charged the storage, an
      embedding of a word-level language model was charged the whole dataset.
    * A sparse tensor: its index and value storages together, keyed by the first.
    """
    if t.layout is not torch.strided:
        parts = storage_parts(t)
        return (hash(t.device), parts[0][0] if parts else 0), sum(n for _, n in parts)
    key = storage_key(t)
    nbytes = int(t.untyped_storage().nbytes())
    if not t.requires_grad and t._is_view():
        extent = extent_bytes(t)
        if extent < nbytes and _alive_elsewhere(t._base):  # (the call shape _count_refs measures)
            return (hash(t.device), int(t.data_ptr())), extent
    return key, nbytes


def _alive_elsewhere(base: Any) -> bool:
    """Whether a view's base tensor has a Python reference of the program's (a variable, a
    global, a dataset's attribute): more references than a base only its view keeps has when
    handed here (measured once: Python versions count the call's own references differently)."""
    if base is None:
        return False
    if not _ALONE:
        _ALONE.append(_refs_alone())
    return sys.getrefcount(base) > _ALONE[0]


_ALONE: list[int] = []


def _refs_alone() -> int:
    view = torch.arange(4)[1:2]  # its base has no Python object of its own
    return _count_refs(view._base)


def _count_refs(base: Any) -> int:
    return sys.getrefcount(base)

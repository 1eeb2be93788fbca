"""Which module holds which, without scanning the heap: the walk up to a model's outermost
container (memscope.agent.torchcompat.module_names).

``gc.get_referrers`` walks every object of the process for each step up: 27 ms beside a small
model after ``import torch``, 0.4 s beside a large dataset, on the first profiled step. Instead,
torch's global registration hooks tell us each module that registers a child, a parameter or a
buffer: every module ``__init__`` builds a part of, every container a child is put in through
``add_module`` or ``setattr``. A module is held by a module only if that one registered a child
at some point (or was filled by a direct ``_modules`` write: ``ModuleList.insert``, which is seen
too, the container having registered children before). So when the registry started before any
module existed (the agent ``memscope attach`` starts as ``import torch`` ends: ``complete``), the
holders of a module are found among the modules it saw, in their ``_modules``.

Asked of gc as before: a module none of them holds that never registered anything itself (a
loss module without a weight, a ``copy.deepcopy`` or unpickled copy: ``__setstate__`` registers
nothing, and such a copy's holder is a copy too), and every module when the registry started late
(``memscope.start()`` after the model was built, ``attach --pid``). Not seen at all: a module put
by a direct ``_modules`` write into a copied container. Weak references only.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from memscope.agent.torchcompat.compiled import is_compiling


def _register(name: str, hook: Callable[..., None]) -> Any:
    register = getattr(torch.nn.modules.module, name, None)
    return register(hook) if register is not None else None


class ModuleParents:
    """The registry. ``start`` at agent start, ``stop`` at its end (or in a forked child);
    :meth:`parent` answers, or says that gc must."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        # id -> weakref of each module seen registering a part. No lock: single dict operations
        # (atomic under the GIL) only, as a weakref callback may run inside any allocation
        self._seen: dict[int, weakref.ReferenceType[Any]] = {}
        self.complete = False  # started before any module existed: its answers hold

    def start(self, complete: bool) -> None:
        """``complete``: no module exists yet. Otherwise nothing is installed: a module built
        before would have holders the hooks never saw, so every answer would be gc's anyway."""
        if self._handles or not complete:
            return
        handles = [_register("register_module_module_registration_hook", self._on_part),
                   _register("register_module_parameter_registration_hook", self._on_part),
                   _register("register_module_buffer_registration_hook", self._on_part)]
        self._handles = [h for h in handles if h is not None]
        self.complete = len(self._handles) == 3

    def stop(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            try:
                h.remove()
            except Exception:
                pass
        self.complete = False
        self._seen = {}

    def _on_part(self, module: Any, _name: str, _value: Any) -> None:
        """torch's hook (any thread, inside the user's ``__init__`` or ``setattr``): never raises,
        never replaces what is being registered."""
        if is_compiling():
            return None
        try:
            key = id(module)
            ref = self._seen.get(key)
            if ref is None or ref() is not module:
                self._seen[key] = weakref.ref(module, self._forget(key))
        except Exception:
            pass
        return None

    def _forget(self, key: int) -> Callable[[Any], None]:
        def gone(ref: Any) -> None:  # the module died; its id may be given to a new one
            try:
                if self._seen.get(key) is ref:
                    self._seen.pop(key, None)
            except Exception:
                pass
        return gone

    def parent(self, module: Any, children: Callable[[Any], int]) -> tuple[bool, tuple[Any, str] | None]:
        """(answered, (the module holding ``module``, under which name) or None). (False, None):
        gc must be asked. With several holders, the one with the most children (``children``)
        wins: the model, not a slice of it."""
        if not self.complete:
            return False, None
        best: tuple[Any, str] | None = None
        for ref in list(self._seen.values()):
            holder = ref()
            if holder is None or holder is module:
                continue
            mods = holder.__dict__.get("_modules")
            if not mods:
                continue
            name = next((k for k, v in mods.items() if v is module), None)
            if name is not None and (best is None or children(holder) > children(best[0])):
                best = (holder, name)
        if best is not None:
            return True, best
        own = self._seen.get(id(module))
        if own is not None and own() is module:
            return True, None  # built since the start, and nothing seen holds it
        return False, None


module_parents = ModuleParents()  # started and stopped by the agent

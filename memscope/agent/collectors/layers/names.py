"""The models seen on profiled steps, and the names their modules' rows get.

A module called with an empty stack is a *root*. Names are those of the root's outermost
container (memscope.agent.torchcompat.module_names: the model the user built, also when a
framework calls a submodule first, ``net.0`` under Lightning; wrappers such as
``torch.compile``'s ``OptimizedModule`` and DDP take the name of what they wrap). The first such
model's names are plain (the model itself is ``""``); later distinct models (a loss module called
on its own, say) are prefixed with their class name and ``":"`` (``"CrossEntropyLoss:"``), and so
is a module the data pipeline calls (a torchvision transform run by the DataLoader before the
model: ``"Normalize:"``), whenever it is first seen.
Everything is held weakly; the walk up to the outermost container is done once per root.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from memscope.agent.collectors.layers.stats import ModuleStats
from memscope.agent.torchcompat.module_names import dotted_names, outermost


@dataclass
class _Root:
    ref: weakref.ReferenceType[Any]  # a module called with an empty stack
    top: weakref.ReferenceType[Any] | None = None  # its outermost container, once resolved
    prefix: str = ""
    in_data: bool = False  # first called by the data pipeline (a transform in a DataLoader)


@dataclass
class _Top:
    ref: weakref.ReferenceType[Any]
    prefix: str  # "" for the first model, "CrossEntropyLoss:" for a later distinct one
    names: dict[int, str] = field(default_factory=dict)


class ModelNames:
    """Roots by id (kept across steps), the roots of the step in progress, their models."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roots: dict[int, _Root] = {}  # id(root) -> names, kept across steps
        self._tops: dict[int, _Top] = {}  # id(outermost container) -> prefix and names
        self.step_roots: set[int] = set()

    def new_step(self) -> None:
        self.step_roots = set()

    def see_root(self, root: Any) -> None:
        """First sight of a root in this step: remember it (named at the end of the step)."""
        with self._lock:
            rid = id(root)
            entry = self._roots.get(rid)
            if entry is None or entry.ref() is not root:
                self._roots = {k: v for k, v in self._roots.items() if v.ref() is not None}
                self._roots[rid] = _Root(weakref.ref(root), in_data=_in_data_pipeline())
            self.step_roots.add(rid)

    def roots(self) -> list[Any]:
        """The outermost modules seen on profiled steps that are still alive (the models)."""
        with self._lock:
            entries = list(self._roots.values())
        return [m for m in (e.ref() for e in entries) if m is not None]

    def step_models(self) -> list[Any]:
        """The roots of the step in progress (or the last one) that are still alive."""
        out = []
        for rid in self.step_roots:
            entry = self._roots.get(rid)
            root = entry.ref() if entry is not None else None
            if root is not None:
                out.append(root)
        return out

    def root_prefix(self, module: Any) -> str:
        """The name prefix of ``module`` when it is a root seen here ("" for the first model,
        ``"CrossEntropyLoss:"`` for a later distinct root), "" otherwise."""
        with self._lock:
            entry = self._roots.get(id(module))
        return entry.prefix if entry is not None and entry.ref() is module else ""

    def module_name(self, module: Any) -> str | None:
        """The full name a root's rows got (its model's prefix and its dotted name in that
        model), from what naming the rows found; None before that. No gc walk: the hooks
        counted at every inventory ask for each model (a walk up through gc referrers took
        0.38 s of a 1 ms-step training's inventory budget, and so every inventory after it)."""
        with self._lock:
            entry = self._roots.get(id(module))
            if entry is None or entry.ref() is not module or entry.top is None:
                return None
            top = entry.top()
            info = self._tops.get(id(top)) if top is not None else None
        if info is None or info.ref() is not top:
            return None
        path = info.names.get(id(module))
        if path is None:
            return None
        return info.prefix + path if path else info.prefix[:-1]

    def models(self, compiled: list[Any]) -> list[Any]:
        """Compiled mode: the models to hook module by module: the outermost containers of the
        compiled modules (found through gc referrers) and of the roots seen so far. A module no
        model holds that was never called on a profiled step before (a loss module) is not
        hooked: what it saves is under NO_MODULE."""
        tops: dict[int, Any] = {}
        with self._lock:
            known = [t.ref() for t in self._tops.values()]
            known += [r.ref() for r in self._roots.values()]
        for m in [*compiled, *known]:
            if m is None:
                continue
            try:
                top = outermost(m)[0]
            except Exception:
                top = m
            tops[id(top)] = top
        return list(tops.values())

    def name(self, stats: dict[tuple[int, int], ModuleStats]) -> list[ModuleStats]:
        """Give each row (keyed by (id(root), id(module))) its name; the models get their
        prefixes in the order their roots were first called."""
        rows: list[ModuleStats] = []
        for rid, root in list(self._roots.items()):
            if rid in self.step_roots:
                try:
                    self._top_of(root)
                except Exception:
                    pass
        for (root_id, mod_id), st in stats.items():
            entry = self._roots.get(root_id)
            info = None
            try:
                info = self._top_of(entry) if entry is not None else None
            except Exception:
                info = None
            top = info.ref() if info is not None else None
            name = None
            if info is not None and top is not None:
                name = info.names.get(mod_id)
                if name is None:  # first time, or a module added since: (re)compute once
                    try:
                        info.names = dotted_names(top)
                    except Exception:
                        info.names = {}
                    name = info.names.get(mod_id)
                if name is not None and info.prefix:
                    name = info.prefix + name if name else info.prefix[:-1]
            st.name = name if name is not None else f"<{st.type}>"
            rows.append(st)
        return rows

    def _top_of(self, entry: _Root) -> _Top | None:
        """The outermost container of a root, its prefix and its names (found once per root:
        a walk up through gc referrers)."""
        root = entry.ref()
        if root is None:
            return None
        top = entry.top() if entry.top is not None else None
        if top is None:
            top = outermost(root)[0]
            entry.top = weakref.ref(top)
        with self._lock:
            self._tops = {k: v for k, v in self._tops.items() if v.ref() is not None}
            info = self._tops.get(id(top))
            if info is None or info.ref() is not top:
                # the model is the first one the data pipeline did not call: a torchvision
                # Normalize (an nn.Module) run by the DataLoader before it is not "(model)"
                plain = not entry.in_data and not any(t.prefix == "" for t in self._tops.values())
                prefix = "" if plain else _model_class(top) + ":"
                info = self._tops[id(top)] = _Top(weakref.ref(top), prefix)
            entry.prefix = info.prefix
        return info


_DATA = os.sep + os.path.join("torch", "utils", "data") + os.sep


def _in_data_pipeline() -> bool:
    """Whether the module being called runs under torch.utils.data (a DataLoader fetching a
    batch: a transform of the dataset's ``__getitem__``). Asked once per root."""
    try:
        frame: Any = sys._getframe(2)
    except ValueError:
        return False
    try:
        for _ in range(64):
            if frame is None:
                return False
            if _DATA in frame.f_code.co_filename:
                return True
            frame = frame.f_back
        return False
    finally:
        del frame


def _model_class(top: Any) -> str:
    """The class name a later distinct model's rows are prefixed with (a wrapper's: what it wraps)."""
    from memscope.agent.torchcompat.module_names import wrapped_child

    seen = 0
    while seen < 4:
        hidden = wrapped_child(top)
        if hidden is None:
            break
        top = top._modules[hidden]
        seen += 1
    return type(top).__name__

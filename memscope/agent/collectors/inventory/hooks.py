"""Hooks counted at inventories, and the line that registers the ones that keep coming.

A hook registered inside the training loop (``model.layer.register_forward_hook(stash)`` every
step) is a leak of its own: the module keeps every hook, each runs at every call from then on, so
steps slow down and whatever the hooks keep grows faster each step. At each inventory the hooks
of the models the agent knows (the outermost modules seen on profiled steps) are counted per
module and kind — forward, forward_pre, backward, backward_pre, state_dict, state_dict_pre,
load_state_dict_pre, load_state_dict_post — with their parameters' tensor hooks (``tensor``:
``p.register_hook``; ``post_accumulate_grad``) and the global module hooks (module ``(global)``).
memscope's own hooks are not counted. Only counts leave: the collector writes them when they
change (a ``hooks`` event).

When a count rose at the last two inventories (three rising points after warm-up), the
registering line is looked for once: for a few steps the registering methods (``Module.register_
forward_hook`` and its kin, ``Tensor.register_hook``, the global ``register_module_*_hook``) are
wrapped, and the first frame outside torch of a call that registers on that module and kind is
the answer (a ``hook_site`` event). The wrappers call the original and return its handle; they
are removed after the window, and never installed once ``torch.compile`` was used. The window
grows when nothing registered in it (2, 8, then 32 steps: hooks added at evaluations only).
"""

from __future__ import annotations

import functools
import os
import sys
from collections import Counter
from typing import Any, Callable

import torch
from torch.nn.modules import module as _nn_module

from memscope.agent.torchcompat.compiled import compile_used
from memscope.constants import WARMUP_STEPS

MODULE_HOOKS = (("forward", "_forward_hooks"), ("forward_pre", "_forward_pre_hooks"),
                ("backward", "_backward_hooks"), ("backward_pre", "_backward_pre_hooks"),
                ("state_dict", "_state_dict_hooks"), ("state_dict_pre", "_state_dict_pre_hooks"),
                ("load_state_dict_pre", "_load_state_dict_pre_hooks"),
                ("load_state_dict_post", "_load_state_dict_post_hooks"))
TENSOR_HOOKS = (("tensor", "_backward_hooks"), ("post_accumulate_grad", "_post_accumulate_grad_hooks"))
GLOBAL_HOOKS = (("forward", "_global_forward_hooks"), ("forward_pre", "_global_forward_pre_hooks"),
                ("backward", "_global_backward_hooks"), ("backward_pre", "_global_backward_pre_hooks"))
GLOBAL = "(global)"
# method -> the kind of hook it registers
_MODULE_METHODS = {"register_forward_hook": "forward", "register_forward_pre_hook": "forward_pre",
                   "register_full_backward_hook": "backward", "register_backward_hook": "backward",
                   "register_full_backward_pre_hook": "backward_pre",
                   "_register_state_dict_hook": "state_dict", "register_state_dict_post_hook": "state_dict",
                   "register_state_dict_pre_hook": "state_dict_pre",
                   "register_load_state_dict_pre_hook": "load_state_dict_pre",
                   "_register_load_state_dict_pre_hook": "load_state_dict_pre",
                   "register_load_state_dict_post_hook": "load_state_dict_post"}
_TENSOR_METHODS = {"register_hook": "tensor", "register_post_accumulate_grad_hook": "post_accumulate_grad"}
_GLOBAL_FUNCTIONS = {"register_module_forward_hook": "forward", "register_module_forward_pre_hook": "forward_pre",
                     "register_module_full_backward_hook": "backward", "register_module_backward_hook": "backward",
                     "register_module_full_backward_pre_hook": "backward_pre"}
WINDOWS = (2, 8, 32)
_MEMSCOPE = "memscope"
_SKIP = tuple(os.path.dirname(str(m.__file__)) + os.sep for m in (torch,) if getattr(m, "__file__", None))
_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def _ours(fn: Any) -> bool:
    """A hook memscope registered (a bound method of one of its objects, or its function)."""
    f = getattr(fn, "__func__", fn)
    return str(getattr(f, "__module__", "") or "").startswith(_MEMSCOPE)


def _count(d: Any) -> int:
    if not d:
        return 0
    try:
        return sum(1 for fn in list(d.values()) if not _ours(fn))
    except Exception:
        return 0


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else (prefix or name)


def named_modules(roots: list[Any], prefix_of: Callable[[Any], str]) -> list[tuple[str, Any]]:
    """(full name, module) of every module of ``roots`` (the model is ``""``: its prefix)."""
    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for root in roots:
        try:
            prefix = prefix_of(root)
            for name, m in root.named_modules():
                if id(m) not in seen:
                    seen.add(id(m))
                    out.append((_join(prefix, name), m))
        except Exception:
            continue
    return out


def count_hooks(modules: list[tuple[str, Any]]) -> dict[str, int]:
    """``"module|kind"`` -> hooks registered there now (non-zero only), memscope's excluded."""
    out: dict[str, int] = {}
    for name, m in modules:
        d = getattr(m, "__dict__", {})
        for kind, attr in MODULE_HOOKS:
            n = _count(d.get(attr))
            if n:
                out[f"{name}|{kind}"] = n
        for pname, p in list(d.get("_parameters", {}).items()):
            if p is None:
                continue
            for kind, attr in TENSOR_HOOKS:
                n = _count(getattr(p, attr, None))
                if n:
                    out[f"{_join(name, pname)}|{kind}"] = n
    for kind, attr in GLOBAL_HOOKS:
        n = _count(getattr(_nn_module, attr, None))
        if n:
            out[f"{GLOBAL}|{kind}"] = n
    return out


def _user_line(frame: Any) -> str | None:
    """``file:line`` of the first frame outside torch; None when that is memscope's."""
    while frame is not None:
        fn = frame.f_code.co_filename
        if not fn.startswith(_SKIP) and not fn.startswith("<frozen"):
            if fn.startswith(_HERE):
                return None
            try:
                rel = os.path.relpath(fn)
                fn = rel if not rel.startswith("..") else fn
            except ValueError:
                pass
            return f"{fn}:{frame.f_lineno}"
        frame = frame.f_back
    return None


class HookWatch:
    """Per inventory: the counts (written when they change), which keys keep growing, and the
    armed search for their registering line."""

    def __init__(self) -> None:
        self.last: dict[str, int] | None = None  # the counts written last
        self._history: dict[str, list[tuple[int, int]]] = {}
        self._tries: dict[str, int] = {}
        self.sites: dict[str, str] = {}  # key -> registering line (found)
        self._armed: dict[str, int] = {}  # key -> armings left to find it
        self._names: dict[int, str] = {}  # id(module or parameter) -> name, while armed
        self._seen: dict[str, Counter[str]] = {}
        self._left = 0  # boundaries left in this arming
        self._patched: list[tuple[Any, str, Any]] = []

    @property
    def armed(self) -> bool:
        return bool(self._patched)

    def changed(self, counts: dict[str, int]) -> bool:
        """Whether ``counts`` differ from the last written ones (then they are the last)."""
        if counts == self.last:
            return False
        self.last = dict(counts)
        return True

    def growing(self, step: int, counts: dict[str, int]) -> list[str]:
        """Keys whose count rose at this inventory and the one before (three rising points
        from the warm-up on) and whose line is neither known nor looked for at the moment."""
        out = []
        for key in set(counts) | set(self._history):
            h = self._history.setdefault(key, [])
            h.append((step, counts.get(key, 0)))
            del h[:-3]
            post = [n for s, n in h if s >= WARMUP_STEPS]
            if len(post) == 3 and post[0] < post[1] < post[2] and key not in self.sites \
                    and self._tries.get(key, 0) < len(WINDOWS):
                out.append(key)
        return out

    # -- the registering line ------------------------------------------------------------------

    def arm(self, keys: list[str], modules: list[tuple[str, Any]]) -> str | None:
        """Wrap the registering methods for a window of steps; why not, when it did not."""
        if self._patched or not keys:
            return None
        if compile_used():
            for key in keys:
                self._tries[key] = len(WINDOWS)  # not again
            return "torch.compile is in use: the registering line of hooks is not looked for"
        names: dict[int, str] = {}
        for name, m in modules:
            names[id(m)] = name
            for pname, p in list(getattr(m, "__dict__", {}).get("_parameters", {}).items()):
                if p is not None:
                    names[id(p)] = _join(name, pname)
        self._names = names
        window = 0
        for key in keys:
            window = max(window, WINDOWS[min(self._tries.get(key, 0), len(WINDOWS) - 1)])
            self._tries[key] = self._tries.get(key, 0) + 1
            self._seen.setdefault(key, Counter())
        self._left = window
        for owner, table in ((torch.nn.Module, _MODULE_METHODS), (torch.Tensor, _TENSOR_METHODS)):
            for method, kind in table.items():
                orig = owner.__dict__.get(method)
                if orig is not None:
                    self._patch(owner, method, self._wrap_method(orig, kind))
        for fname, kind in _GLOBAL_FUNCTIONS.items():
            orig = getattr(_nn_module, fname, None)
            if orig is not None:
                self._patch(_nn_module, fname, self._wrap_global(orig, kind))
        return None

    def _patch(self, owner: Any, name: str, wrapper: Any) -> None:
        orig = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, wrapper)
        self._patched.append((owner, name, orig))

    def _wrap_method(self, orig: Any, kind: str) -> Any:
        watch = self

        @functools.wraps(orig)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            handle = orig(self, *args, **kwargs)
            try:
                watch._seen_one(watch._names.get(id(self)), kind, sys._getframe(1))
            except Exception:
                pass
            return handle
        return wrapper

    def _wrap_global(self, orig: Any, kind: str) -> Any:
        watch = self

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            handle = orig(*args, **kwargs)
            try:
                watch._seen_one(GLOBAL, kind, sys._getframe(1))
            except Exception:
                pass
            return handle
        return wrapper

    def _seen_one(self, name: str | None, kind: str, frame: Any) -> None:
        if name is None:
            return
        key = f"{name}|{kind}"
        seen = self._seen.get(key)
        if seen is None or key in self.sites:
            return
        line = _user_line(frame)
        if line is not None:
            seen[line] += 1

    def boundary(self) -> dict[str, str]:
        """At a step boundary while armed: the lines found when the window ends."""
        if not self._patched:
            return {}
        self._left -= 1
        if self._left > 0:
            return {}
        self.disarm()
        found: dict[str, str] = {}
        for key, seen in list(self._seen.items()):
            if seen:
                found[key] = seen.most_common(1)[0][0]
                self.sites[key] = found[key]
                del self._seen[key]
        return found

    def disarm(self) -> None:
        """Put the original methods back (idempotent)."""
        for owner, name, orig in reversed(self._patched):
            try:
                setattr(owner, name, orig)
            except Exception:
                pass
        self._patched = []
        self._names = {}

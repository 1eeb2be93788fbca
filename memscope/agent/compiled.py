"""What memscope needs to know about ``torch.compile`` to stay out of its way.

* :data:`is_compiling` is ``torch.compiler.is_compiling``: every hook, mode and wrapper of the
  agent that Dynamo may trace returns at once when it is true, so Dynamo inlines it as nothing
  (no graph break, no ``Unsupported`` under ``fullgraph=True``). The same function object must
  be called: Dynamo recognises it and folds it to a constant.
* Global module hooks are not safe with ``torch.compile(module)``: ``OptimizedModule.__call__``
  warns ("Using torch.compile(module) when there are global hooks...") whenever one is
  installed. :func:`compiled_modules_alive` says whether such a module exists (then the layer
  profiler hooks modules one by one), and :class:`CompileWatch` calls back when one is created
  while global hooks are in place (a module registration hook: it sees ``OptimizedModule``
  registering ``_orig_mod`` in its constructor, before the module can be called).
* :func:`compile_used` says whether Dynamo compiled anything in this process: a function mode
  on the stack is part of Dynamo's guards, so pushing one would recompile.
"""

from __future__ import annotations

import gc
import sys
from typing import Any, Callable

import torch


def _never() -> bool:
    return False


is_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", None) or _never


def optimized_module_type() -> type | None:
    """``torch._dynamo.eval_frame.OptimizedModule`` when Dynamo is imported (never imports it)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    t = getattr(eval_frame, "OptimizedModule", None)
    return t if isinstance(t, type) else None


def compiled_modules_alive() -> bool:
    """Whether a ``torch.compile(module)`` result is alive (a scan of the heap's referrers to
    the class, only once Dynamo is imported)."""
    t = optimized_module_type()
    if t is None:
        return False
    refs = gc.get_referrers(t)
    try:
        return any(isinstance(o, t) for o in refs)
    finally:
        refs.clear()


def compile_used() -> bool:
    """Whether Dynamo compiled a frame in this process, or a compiled module exists."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    try:
        if counters is not None and (counters["stats"]["unique_graphs"] or counters["frames"]["ok"]):
            return True
    except Exception:
        pass
    return compiled_modules_alive()


class CompileWatch:
    """While installed, ``callback(optimized_module, module)`` runs when ``torch.compile(module)``
    builds an ``OptimizedModule`` (from its constructor, before anything can call it, and before
    ``module`` is registered in it)."""

    def __init__(self, callback: Callable[[Any, Any], None]) -> None:
        self._callback = callback
        self._handle: Any = None

    def install(self) -> None:
        if self._handle is not None:
            return
        register = getattr(torch.nn.modules.module, "register_module_module_registration_hook", None)
        if register is not None:
            self._handle = register(self._registered)

    def remove(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                handle.remove()
            except Exception:
                pass

    def _registered(self, module: Any, name: str, submodule: Any) -> None:
        if is_compiling():
            return None
        try:
            if name == "_orig_mod" and type(module).__name__ == "OptimizedModule":
                self._callback(module, submodule)
        except Exception:
            pass
        return None  # never replace the module being registered


def _lazy_graph_module_type() -> type | None:
    mod = sys.modules.get("torch.fx._lazy_graph_module")
    t = getattr(mod, "_LazyGraphModule", None)
    return t if isinstance(t, type) else None


def is_compiler_module(module: Any) -> bool:
    """A graph module made by Dynamo / AOTAutograd / Inductor (they build lazy graph modules;
    ``torch.fx.symbolic_trace`` does not by default): part of a compiled region, never the
    user's model."""
    t = _lazy_graph_module_type()
    return t is not None and isinstance(module, t)

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
* :data:`shield` hides memscope's module hooks from Dynamo while it compiles (a compiled
  function calling the model, ``model.compile()``, a recompile for a new shape, an evaluation
  compiled for the first time during a profiled step): Dynamo's compile-start callback takes
  them out of their hook dicts and its compile-end callback puts them back under the same ids.
  Hooks present while Dynamo traces would be inlined (as nothing) but guarded on (the hook ids
  of the global dicts, the number of a module's hooks), and the graph compiled once more when
  they are gone; hooks absent while it traces are not guarded on, so the compiled code is the
  same with and without memscope. No module code runs while Dynamo compiles, so nothing is
  missed. The callbacks are registered when ``torch._dynamo`` is imported (memscope never
  imports it: a one-shot import watcher waits for it).
* :func:`runtime_only` marks the agent's functions that run inside the training (hooks, the
  pack hook, weakref and autograd callbacks): Dynamo is told to skip their frames, and every
  frame they call (``FrameExecStrategy(SKIP, SKIP)``). Called while a compiled function or a
  ``model.compile()``d module runs (its eager parts, the hooks of ``_call_impl``), they would
  otherwise be compiled as frames of their own: Dynamo's frame counters change, and the
  compiled copy, folded for ``is_compiling()``, would do nothing.
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import sys
import threading
import weakref
from types import CodeType, ModuleType
from typing import Any, Callable, Sequence, TypeVar

import torch


def _never() -> bool:
    return False


is_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", None) or _never


def optimized_module_type() -> type | None:
    """``torch._dynamo.eval_frame.OptimizedModule`` when Dynamo is imported (never imports it)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    t = getattr(eval_frame, "OptimizedModule", None)
    return t if isinstance(t, type) else None


def _scan_optimized_modules() -> list[Any]:
    """The ``torch.compile(module)`` results alive now: the referrers of their class, once Dynamo
    is imported. ``gc.get_referrers`` walks every object of the process (30 ms after a bare
    ``import torch``, far more beside a large dataset): done once, when :data:`compiled_seen`
    starts; from then on the modules are seen being built. ``gc.get_referrers``, not
    ``gc.get_objects``: a list of every object would keep, for the length of the scan, objects
    other threads are dropping (an sqlite3 cursor whose statement must be reset before its
    connection commits, say)."""
    t = optimized_module_type()
    if t is None:
        return []
    refs = gc.get_referrers(t)
    try:
        return [o for o in refs if isinstance(o, t)]
    finally:
        refs.clear()


def optimized_modules() -> list[Any]:
    """The ``torch.compile(module)`` results alive now."""
    return compiled_seen.alive()


class CompiledSeen:
    """Every ``OptimizedModule`` alive, without a walk over every object at each question: the
    ones alive when :meth:`start` ran (one scan), then each one as ``torch.compile(module)``
    builds it (a module registration hook: not a forward hook, so compiled modules do not warn
    about it). Weak references only. Before :meth:`start` (or after :meth:`stop`), each question
    scans."""

    def __init__(self) -> None:
        self._modules: weakref.WeakSet[Any] = weakref.WeakSet()
        self._watch: CompileWatch | None = None

    def start(self) -> None:
        if self._watch is not None:
            return
        self._watch = CompileWatch(lambda optimized, _module: self._modules.add(optimized))
        self._watch.install()
        if not self._watch.installed:  # no registration hooks in this torch: scan each time
            self._watch = None
            return
        for m in _scan_optimized_modules():
            self._modules.add(m)

    def stop(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.remove()
        self._modules = weakref.WeakSet()

    def alive(self) -> list[Any]:
        if self._watch is None:
            return _scan_optimized_modules()
        return list(self._modules)


def compiled_modules_alive() -> bool:
    """Whether a ``torch.compile(module)`` result is alive."""
    return bool(optimized_modules())


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

    @property
    def installed(self) -> bool:
        return self._handle is not None

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


compiled_seen = CompiledSeen()  # started and stopped by the agent


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


HandlesFn = Callable[[], list[Any]]  # the RemovableHandles of hooks to hide, now
F = TypeVar("F", bound=Callable[..., Any])
_RUNTIME_ONLY: list[CodeType] = []


def runtime_only(fn: F) -> F:
    """Dynamo never compiles this function's frames, nor those of the functions it defines and
    calls (see the module doc). Returns ``fn`` itself."""
    code = getattr(fn, "__code__", None)
    if isinstance(code, CodeType):
        todo = [code]
        while todo:
            c = todo.pop()
            _RUNTIME_ONLY.append(c)
            todo.extend(k for k in c.co_consts if isinstance(k, CodeType))  # nested functions
        if shield.registered:
            _skip_codes()
    return fn


def _skip_codes() -> None:
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )

        strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
        for code in _RUNTIME_ONLY:
            set_code_exec_strategy(code, strategy)
    except Exception:
        pass


class DynamoShield:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._providers: list[weakref.WeakMethod[HandlesFn]] = []
        self._stashed: list[tuple[Any, Any, Any]] = []  # (hook dict, id, hook)
        self.registered = False
        self._watcher: _DynamoWatcher | None = None

    def add(self, provider: HandlesFn) -> None:
        """Hide the hooks ``provider()`` (a bound method, held weakly) returns whenever Dynamo
        compiles."""
        with self._lock:
            self._providers = [p for p in self._providers if p() is not None]
            self._providers.append(weakref.WeakMethod(provider))
        self._register()

    def _handles(self) -> list[Any]:
        with self._lock:
            providers = [p() for p in self._providers]
        return [h for provider in providers if provider is not None for h in provider()]

    def _register(self) -> None:
        if self.registered:
            return
        dynamo = sys.modules.get("torch._dynamo")
        handler = getattr(dynamo, "callback_handler", None)
        if handler is None:
            if self._watcher is None and dynamo is None:
                self._watcher = _DynamoWatcher(self._register)
                sys.meta_path.insert(0, self._watcher)
            return
        try:
            handler.register_start_callback(self._start)
            handler.register_end_callback(self._end)
            self.registered = True
        except Exception:
            pass
        _skip_codes()

    def _start(self, *args: Any) -> None:
        try:
            for handle in self._handles():
                hooks = handle.hooks_dict_ref()
                if hooks is not None and handle.id in hooks:
                    self._stashed.append((hooks, handle.id, hooks.pop(handle.id)))
        except Exception:
            self._end()

    def _end(self, *args: Any) -> None:
        stashed, self._stashed = self._stashed, []
        try:  # only hooks still installed as far as their owner knows (none removed meanwhile)
            live = {(id(h.hooks_dict_ref()), h.id) for h in self._handles()}
        except Exception:
            live = None
        for hooks, hid, hook in stashed:
            try:
                if live is None or (id(hooks), hid) in live:
                    hooks[hid] = hook
            except Exception:
                pass


shield = DynamoShield()
runtime_only(CompileWatch._registered)


class _DynamoWatcher(importlib.abc.MetaPathFinder):
    """One shot: when ``torch._dynamo`` has been imported (by the script's torch.compile), call
    ``then``. It finds the module with the other finders and wraps its loader."""

    def __init__(self, then: Callable[[], None]) -> None:
        self._then = then

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch._dynamo":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenAfterExec(spec.loader, self._then)
                return spec
        return None


class _ThenAfterExec(importlib.abc.Loader):
    def __init__(self, inner: Any, then: Callable[[], None]) -> None:
        self.inner = inner
        self._then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.inner  # the module sees its real loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        try:
            self._then()
        except Exception:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

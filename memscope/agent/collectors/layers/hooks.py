"""Where the layer profiler's forward pre / post hooks go: global, or module by module.

``torch.compile`` (memscope.agent.torchcompat.compiled): the module hooks are out of Dynamo's
sight while it compiles (``shield``: so it never guards on them, and adding or removing them
never recompiles), and every hook returns at once if Dynamo traces it anyway, so it inlines as
nothing (no graph break, no failure under ``fullgraph=True``). Global module hooks make
``OptimizedModule.__call__`` warn, so while a compiled module exists (or from the moment
``torch.compile(module)`` builds one during a profiled step) the hooks go on the modules of the
models one by one instead (picklable, inert when pickled), outside compiled regions: the models
holding the compiled modules and those seen before. Graph modules the compiler made are never
hooked. Between profiled steps every hook is removed, so PyTorch's no-hook fast path returns.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from torch.nn.modules import module as _nn_module

from memscope.agent.torchcompat.compiled import (
    CompileWatch,
    is_compiler_module,
    is_compiling,
    optimized_modules,
    runtime_only,
    shield,
)
from memscope.agent.torchcompat.handles import remove_quietly

PreHook = Callable[[Any, Any], None]
PostHook = Callable[[Any, Any, Any], None]


class ModuleHooks:
    """Installs ``pre`` and ``post`` (bound methods: per-module hooks hold them weakly) for one
    profiled step. ``models(compiled)`` names the models to hook one by one in compiled mode;
    ``active`` says whether the step is still profiled."""

    def __init__(self, pre: PreHook, post: PostHook, models: Callable[[list[Any]], list[Any]],
                 active: Callable[[], bool]) -> None:
        self._pre, self._post = pre, post
        self._models = models
        self._active = active
        # compiled mode: a torch.compile(module) result exists, so hooks go on each module
        self.compiled_mode = False
        self._watch = CompileWatch(self._on_compiled)
        self._global: list[Any] = []
        self._handles: list[Any] = []
        self._hooked: set[int] = set()  # ids of modules hooked one by one in this step
        shield.add(self._all_handles)  # out of Dynamo's sight while it compiles

    def install(self) -> None:
        self._hooked = set()
        compiled = optimized_modules()
        self.compiled_mode = self.compiled_mode or bool(compiled)
        if self.compiled_mode:
            self._hook_each(self._models(compiled))
        else:
            # No always_call: Dynamo tracing a call with an always-called hook guards on that
            # hook's id, and the next step's hook has another: a recompile. A forward that
            # raises leaves its frame on the stack instead (the profiler's pre hook copes).
            self._global.append(_nn_module.register_module_forward_pre_hook(self._pre))
            self._global.append(_nn_module.register_module_forward_hook(self._post))
            self._watch.install()  # torch.compile(module) during the step: go per module

    def remove(self) -> None:
        self._watch.remove()
        self._remove_global()
        remove_quietly(self._handles)
        self._handles.clear()
        self._hooked = set()

    def _all_handles(self) -> list[Any]:
        return [*self._global, *self._handles]

    def _remove_global(self) -> None:
        remove_quietly(self._global)
        self._global = []

    def _hook_each(self, tops: list[Any]) -> None:
        """Compiled mode: a pre and a post hook on every module of ``tops`` (not on graph
        modules the compiler made)."""
        pre, post = _PreHook(self._pre), _PostHook(self._post)
        todo = [t for t in tops if not is_compiler_module(t)]
        while todo:
            m = todo.pop()
            if id(m) in self._hooked:
                continue
            self._hooked.add(id(m))
            compiled_in_place = getattr(m, "_compiled_call_impl", None) is not None
            if not compiled_in_place:  # module.compile(): its hooks would run compiled
                try:
                    self._handles.append(m.register_forward_pre_hook(pre))
                    self._handles.append(m.register_forward_hook(post))
                except Exception:
                    pass
            if compiled_in_place or type(m).__name__ == "OptimizedModule":
                continue  # nothing inside a compiled region runs as a module: no hooks there
            try:
                todo.extend(c for c in m._modules.values()
                            if c is not None and not is_compiler_module(c))
            except Exception:
                pass

    def _on_compiled(self, optimized: Any, wrapped: Any) -> None:
        """``torch.compile(wrapped)`` is building ``optimized`` during a profiled step that has
        global hooks: before it can be called (and warn), swap them for per-module hooks, none
        inside ``wrapped`` (not yet registered in ``optimized``, so still a top of its own).
        The registration hook calling this stays installed (removing it while torch iterates
        over the registration hooks would fail) until the step ends."""
        if not self._active() or self.compiled_mode:
            return
        self.compiled_mode = True
        self._remove_global()
        self._hooked.update(id(m) for m in wrapped.modules())
        self._hook_each([optimized, *self._models([wrapped])])


class _PreHook:
    """A per-module forward pre-hook (compiled mode). It holds the profiler's hook weakly, and a
    model pickled whole during a profiled step (torch.save(model), copy.deepcopy) carries an
    inert copy instead of failing on the profiler's locks."""

    def __init__(self, hook: Callable[..., None]) -> None:
        self._hook: Any = weakref.WeakMethod(hook)

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._hook = _nothing

    @runtime_only
    def __call__(self, module: Any, args: Any) -> None:
        if is_compiling():
            return None  # Dynamo traces this as nothing
        hook = self._hook()
        if hook is not None:
            hook(module, args)
        return None


class _PostHook(_PreHook):
    @runtime_only
    def __call__(self, module: Any, args: Any, output: Any) -> None:  # type: ignore[override]
        if is_compiling():
            return None
        hook = self._hook()
        if hook is not None:
            hook(module, args, output)
        return None


def _nothing() -> None:
    return None

"""Where out-of-memory errors the script catches itself are seen, before they unwind the step.

* :class:`ArmedHooks`: a global module forward pre-hook and an ``always_call`` forward hook,
  installed only while *armed*: in step 0 (a batch-size finder's first tries, and it is how the
  models are found without a profiled step), on steps the layer profiler profiles (its own
  global hooks have already taken PyTorch's no-hook fast path away), after a step whose memory
  peak reached ``ARM_SHARE`` of what the process may use, and after an OOM. While armed, they
  log the step's module calls as autograd sequence ranges (:class:`CallLog`: the census
  attributes activations to modules with it) and see every forward that raises. Between armed
  steps they are removed: the fast path returns.
* :class:`RootHook` (``--catch-forward-oom``): an ``always_call`` forward hook on each root
  model, for every step. It is stored on the model: pickled (``torch.save(model)``,
  ``copy.deepcopy``) it becomes an inert standard-library callable, so the file loads without
  memscope; ``torch.jit.script`` refuses a module carrying a Python hook, hence opt-in.
* :func:`guard_optimizers`: ``Optimizer.profile_hook_step`` (the wrapper torch puts around
  every optimizer class's ``step`` the first time one is built) wrapped so that an OOM raised
  inside ``step()`` is recorded before it leaves it, caught by the script or not. Classes whose
  ``step`` torch wrapped before memscope started are not covered (their unhandled OOMs still are).

Nothing here keeps a module, tensor or exception: module ids, type names and weak references.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import sys
import threading
import weakref
from typing import Any, Callable

from memscope.agent.torchcompat.compiled import CompileWatch, compiled_modules_alive, runtime_only, shield
from memscope.agent.collectors.oom_census import CallLog
from memscope.agent.torchcompat.handles import remove_quietly

ARM_SHARE = 0.25  # a step that peaked above this share of the memory limit arms the next one

OnOom = Callable[[BaseException, str], None]  # (exception, where) -> records it once


class ArmedHooks:
    def __init__(self, on_oom: OnOom) -> None:
        self._on_oom = on_oom
        self._handles: list[Any] = []
        self._local = threading.local()
        self._seq: Callable[[], int] | None = None
        self._grad_enabled: Callable[[], bool] | None = None
        self._compiling: Callable[[], bool] = _never
        self.roots: dict[int, weakref.ReferenceType[Any]] = {}  # outermost modules seen, in order
        self._lock = threading.Lock()
        self.generation = 0  # bumped at each step: a thread's log from an older step is stale
        # A torch.compile'd model was called: global hooks present while dynamo compiles make it
        # trace them (and recompile when they change), so they are taken away for good.
        self.compiled = False
        # torch.compile(module) built one during an armed step: take the global hooks away
        # before it is called (OptimizedModule.__call__ warns when there are global hooks)
        self._watch = CompileWatch(self._on_compiled)
        shield.add(self._hook_handles)  # out of Dynamo's sight while it compiles

    def _hook_handles(self) -> list[Any]:
        return list(self._handles)

    def _on_compiled(self, optimized: Any, wrapped: Any) -> None:
        self.compiled = True
        self._remove_hooks()  # not the watch: torch is iterating the registration hooks now

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        if self._handles or self.compiled:
            return
        if compiled_modules_alive():  # a torch.compile(module) exists: its calls would warn
            self.compiled = True
            return
        import torch
        from torch.nn.modules import module as nn_module

        self._seq = torch._C._autograd._get_sequence_nr
        self._grad_enabled = torch.is_grad_enabled
        self._compiling = _compiling_check(torch)
        self._handles.append(nn_module.register_module_forward_pre_hook(self._pre))
        self._handles.append(nn_module.register_module_forward_hook(self._post, always_call=True))
        self._watch.install()

    def disarm(self) -> None:
        if self._handles:
            self._remove_hooks()
        self._watch.remove()

    def _remove_hooks(self) -> None:
        remove_quietly(self._handles)
        self._handles.clear()

    def new_step(self) -> None:
        self.generation += 1

    def log(self) -> CallLog | None:
        """This thread's log of the step in progress (None: not armed during it)."""
        log = getattr(self._local, "log", None)
        if log is None or getattr(self._local, "generation", -1) != self.generation:
            return None
        return log

    def _thread_log(self) -> CallLog:
        if getattr(self._local, "generation", -1) != self.generation:
            self._local.log = CallLog()
            self._local.generation = self.generation
        log: CallLog = self._local.log
        return log

    @runtime_only
    def _pre(self, module: Any, args: Any) -> None:
        # Inside a region torch.compile traces, do nothing: a call dynamo cannot trace would break
        # its graph (and warn). The compiled module's own call is still seen, in eager mode.
        if self._compiling():
            return
        try:
            if type(module).__name__ == "OptimizedModule":
                self.compiled = True
                self.disarm()  # before dynamo compiles the model's call (see __init__)
                return
            log = self._thread_log()
            if not log.stack and self._grad_enabled is not None and self._grad_enabled():
                self._see_root(module)
            log.enter(module, self._seq() if self._seq is not None else 0)
        except Exception:
            pass

    @runtime_only
    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self._compiling():
            return
        try:
            self._thread_log().leave(self._seq() if self._seq is not None else 0)
            if output is None:
                exc = sys.exc_info()[1]
                if exc is not None:
                    self._on_oom(exc, "forward_hook")
        except Exception:
            pass

    def _see_root(self, module: Any) -> None:
        rid = id(module)
        ref = self.roots.get(rid)
        if ref is not None and ref() is module:
            return
        with self._lock:
            self.roots = {k: v for k, v in self.roots.items() if v() is not None}
            self.roots[rid] = weakref.ref(module)

    def see_roots(self, modules: list[Any]) -> None:
        for m in modules:
            try:
                self._see_root(m)
            except TypeError:  # not weakly referenceable
                pass

    def live_roots(self) -> list[Any]:
        return [m for m in (r() for r in list(self.roots.values())) if m is not None]


class RootHook:
    """The ``--catch-forward-oom`` hook on a root model: it holds the recorder's callback weakly
    and looks only at the exception in flight, never at the output."""

    def __init__(self, on_oom: OnOom) -> None:
        self._ref: Any = weakref.WeakMethod(on_oom) if hasattr(on_oom, "__self__") else (lambda: on_oom)

    # Pickled with the model (torch.save(model), copy.deepcopy): an inert standard-library
    # callable that takes (module, args, output) and returns None, so loading needs no memscope.
    def __reduce__(self) -> tuple[Any, ...]:
        return (functools.partial, (contextlib.AbstractContextManager.__exit__, None))

    @runtime_only
    def __call__(self, module: Any, args: Any, output: Any) -> None:
        if output is not None:
            return None
        try:
            exc = sys.exc_info()[1]
            fn = self._ref()
            if exc is not None and fn is not None:
                fn(exc, "forward_hook")
        except Exception:
            pass
        return None


def _never() -> bool:
    return False


def _compiling_check(torch: Any) -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` (constant True while dynamo traces), where this torch has it."""
    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return fn if callable(fn) else _never


# -- the optimizer step ------------------------------------------------------------------------

_optimizer_callback: Callable[[], OnOom | None] = lambda: None  # noqa: E731 - set by guard_optimizers
_original_profile_hook_step: Any = None


def guard_optimizers(on_oom: OnOom) -> bool:
    """Wrap ``torch.optim.Optimizer.profile_hook_step`` (see the module doc). False when this
    torch has none. The callback is held weakly."""
    global _optimizer_callback, _original_profile_hook_step
    import torch

    optimizer = torch.optim.Optimizer
    current = optimizer.__dict__.get("profile_hook_step")
    if not isinstance(current, staticmethod):
        return False
    ref = weakref.WeakMethod(on_oom) if hasattr(on_oom, "__self__") else (lambda: on_oom)
    _optimizer_callback = ref
    if _original_profile_hook_step is not None:
        return True  # already wrapped (a second agent in this process): new callback only
    original = current.__func__
    _original_profile_hook_step = current

    def profile_hook_step(func: Any) -> Any:
        wrapped = original(func)

        @functools.wraps(wrapped)
        def step(*args: Any, **kwargs: Any) -> Any:
            try:
                return wrapped(*args, **kwargs)
            except Exception as exc:
                try:
                    cb = _optimizer_callback()
                    if cb is not None:
                        cb(exc, "optimizer")
                except Exception:
                    pass
                raise

        return step

    optimizer.profile_hook_step = staticmethod(profile_hook_step)  # type: ignore[method-assign]
    return True


def unguard_optimizers() -> None:
    """New optimizer classes get torch's own wrapper again; classes already wrapped keep ours,
    which does nothing once the callback is gone."""
    global _optimizer_callback, _original_profile_hook_step
    _optimizer_callback = lambda: None  # noqa: E731
    if _original_profile_hook_step is None:
        return
    try:
        import torch

        torch.optim.Optimizer.profile_hook_step = _original_profile_hook_step  # type: ignore[method-assign]
    except Exception:
        pass
    _original_profile_hook_step = None


# -- how much memory the process may use ---------------------------------------------------------

def host_total() -> int | None:
    """The machine's memory in bytes: sysconf where it answers (what psutil reads too, without
    importing psutil into every attached process at start), else psutil."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if total > 0:
            return int(total)
    except (AttributeError, ValueError, OSError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:
        return None


def host_limits() -> dict[str, int | None]:
    """The limits a CPU process runs into: the machine's memory, a cgroup's, the address-space
    rlimit (``ulimit -v``: compared with virtual size, not RSS)."""
    out: dict[str, int | None] = {"host_total": None, "cgroup": None, "address_space": None}
    out["host_total"] = host_total()
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit() and int(text) < (1 << 60):
                out["cgroup"] = int(text)
                break
        except OSError:
            continue
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY and soft > 0:
            out["address_space"] = int(soft)
    except (ValueError, OSError):
        pass
    return out


def host_share(limits: dict[str, int | None], rss: int | None, vms: int | None) -> float:
    """The largest share of a limit the process reached: the step's peak RSS of the machine or
    cgroup, the virtual size (now, or at least the peak RSS) of the address-space rlimit."""
    share = 0.0
    for key in ("host_total", "cgroup"):
        lim = limits.get(key)
        if lim and rss:
            share = max(share, rss / lim)
    lim = limits.get("address_space")
    if lim:
        # the step's peak RSS bounds its peak virtual size from below (memory freed at the step's
        # end often goes back to the system, so the virtual size read then is no peak)
        share = max(share, max(vms or 0, rss or 0) / lim)
    return share


def alloc_conf() -> str:
    """The CUDA allocator configuration the process was started with."""
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""

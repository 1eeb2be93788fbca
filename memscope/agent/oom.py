"""Out-of-memory post-mortems, recorded inside the training process as the error happens.

An exception is an OOM when it is ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``)
or a ``RuntimeError`` whose message says "can't allocate memory" (the CPU allocator) or "out of
memory". It is seen at up to three places, and recorded once (by identity):

* the ``torch.autograd.backward`` wrapper of :mod:`memscope.agent.steps` (phase ``backward``;
  the exception is re-raised unchanged, so a script that catches it still gets it);
* a forward hook with ``always_call=True`` on each *root* module the layer profiler has seen
  (not a global hook: only the root loses PyTorch's no-hook fast path); it runs while the
  failing forward unwinds, so forward OOMs the script catches itself are seen too;
* ``sys.excepthook`` / ``threading.excepthook`` (chained to the previous hooks): any OOM nobody
  caught.

On CUDA the allocator's OOM observer (attached once CUDA is initialised) gives the exact
requested size and the device's free bytes at the moment of failure.

Nothing here keeps a reference to the exception, its traceback or a tensor past the call.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memscope.agent.host import CollectorHost

_CPU_REQUEST = re.compile(r"you tried to allocate (\d+) bytes")
_CUDA_REQUEST = re.compile(r"Tried to allocate ([\d.]+) ?([KMGTP]?i?B)", re.IGNORECASE)
_CUDA_DEVICE = re.compile(r"GPU (\d+)")
_UNITS = {"b": 1, "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4,
          "pib": 1024 ** 5, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4}
_MARK = "_memscope_oom_recorded"
_MODULE_FRAMES = {"forward", "_call_impl", "_wrapped_call_impl", "inner"}


def is_oom(exc: BaseException | None) -> bool:
    if exc is None:
        return False
    try:
        import torch

        oom_type = getattr(torch, "OutOfMemoryError", None)
        if oom_type is not None and isinstance(exc, oom_type):
            return True
    except Exception:
        pass
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return "can't allocate memory" in text or "out of memory" in text
    return False


def parse_requested(message: str) -> tuple[int | None, bool]:
    """(requested bytes, exact) from an allocator message; (None, False) when it says nothing."""
    m = _CPU_REQUEST.search(message)
    if m:
        return int(m.group(1)), True
    m = _CUDA_REQUEST.search(message)
    if m:
        unit = _UNITS.get(m.group(2).lower())
        if unit is not None:
            return int(float(m.group(1)) * unit), False  # "20.00 MiB" is rounded
    return None, False


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:500]


def module_stack(tb: Any) -> list[Any]:
    """Modules whose forward is on the traceback, outermost first (deduplicated)."""
    import torch

    out: list[Any] = []
    seen: set[int] = set()
    while tb is not None:
        frame = tb.tb_frame
        code = frame.f_code
        if code.co_name in _MODULE_FRAMES and "self" in code.co_varnames:
            try:
                obj = frame.f_locals.get("self")
            except Exception:
                obj = None
            if isinstance(obj, torch.nn.Module) and id(obj) not in seen:
                seen.add(id(obj))
                out.append(obj)
        tb = tb.tb_next
    return out


def _in_optimizer(tb: Any) -> bool:
    import torch

    while tb is not None:
        code = tb.tb_frame.f_code
        if "self" in code.co_varnames and code.co_name in ("step", "wrapper", "_use_grad"):
            try:
                if isinstance(tb.tb_frame.f_locals.get("self"), torch.optim.Optimizer):
                    return True
            except Exception:
                pass
        if code.co_filename.replace("\\", "/").endswith("torch/optim/optimizer.py"):
            return True
        tb = tb.tb_next
    return False


def _names(modules: list[Any], prefix: str) -> list[str | None]:
    """Dotted names of ``modules`` (outermost first) in the first one's ``named_modules()``."""
    if not modules:
        return []
    root = modules[0]
    target = getattr(root, "_orig_mod", root) if type(root).__name__ == "OptimizedModule" else root
    by_id: dict[int, str] = {}
    try:
        for name, mod in target.named_modules(remove_duplicate=False):
            by_id.setdefault(id(mod), name)
    except Exception:
        pass
    by_id[id(root)] = ""
    out: list[str | None] = []
    for m in modules:
        name = by_id.get(id(m))
        out.append(None if name is None else prefix + name if (prefix or name) else "")
    return out


class OomRecorder:
    """Owned by the :class:`Agent`; every method swallows its own failures."""

    def __init__(self, agent: "CollectorHost") -> None:
        self._agent = weakref.ref(agent)
        self._lock = threading.Lock()
        # Exceptions cannot be weakly referenced (see seen()); bounded fallback keys
        self._seen: deque[tuple[int, str]] = deque(maxlen=64)
        self.pending_failed: dict[str, Any] | None = None  # the last OOM's step, not yet closed
        self.count = 0
        self._prev_excepthook: Any = None
        self._prev_thread_hook: Any = None
        self._hooked_roots: dict[int, tuple[weakref.ReferenceType[Any], Any]] = {}
        self._observer_attached = False
        self._observed: dict[int, dict[str, Any]] = {}  # thread id -> observer's last reading

    # -- install / remove ----------------------------------------------------------------------

    def install(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_thread_hook = threading.excepthook
        threading.excepthook = self._thread_excepthook

    def remove(self) -> None:
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook or sys.__excepthook__
        if threading.excepthook == self._thread_excepthook:
            threading.excepthook = self._prev_thread_hook or threading.__excepthook__
        for ref, handle in list(self._hooked_roots.values()):
            try:
                handle.remove()
            except Exception:
                pass
        self._hooked_roots.clear()

    def _excepthook(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if is_oom(exc):
                self.record(exc, tb, where="unhandled")
        except Exception:
            pass
        (self._prev_excepthook or sys.__excepthook__)(exc_type, exc, tb)

    def _thread_excepthook(self, args: Any) -> None:
        try:
            if is_oom(args.exc_value):
                self.record(args.exc_value, args.exc_traceback, where="unhandled")
        except Exception:
            pass
        (self._prev_thread_hook or threading.__excepthook__)(args)

    # -- root forward hooks --------------------------------------------------------------------

    def hook_roots(self, roots: list[Any]) -> None:
        """A forward hook that always runs on each root module not hooked yet."""
        for root in roots:
            rid = id(root)
            entry = self._hooked_roots.get(rid)
            if entry is not None and entry[0]() is root:
                continue
            try:
                handle = root.register_forward_hook(_RootHook(self), always_call=True)
            except TypeError:
                return  # a torch without always_call: unhandled OOMs are still seen
            self._hooked_roots[rid] = (weakref.ref(root), handle)

    # -- CUDA ----------------------------------------------------------------------------------

    def attach_cuda_observer(self) -> None:
        """Call only once CUDA is initialised (DESIGN.md section 5)."""
        if self._observer_attached:
            return
        import torch

        self._observer_attached = True
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return
        ref = weakref.ref(self)

        def observer(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
            rec = ref()
            if rec is not None:
                rec._observed[threading.get_ident()] = {
                    "device": int(device), "requested_bytes": int(alloc),
                    "device_allocated": int(device_allocated), "device_free": int(device_free),
                    "t": time.time()}

        attach(observer)

    # -- recording -----------------------------------------------------------------------------

    def seen(self, exc: BaseException) -> bool:
        # A private mark on the exception itself: an id alone is reused by the next identical
        # OOM of a retry loop once the first exception is freed. Exceptions without a __dict__
        # fall back to (id, message).
        try:
            if getattr(exc, _MARK, False):
                return True
            setattr(exc, _MARK, True)
            return False
        except Exception:
            pass
        key = (id(exc), f"{type(exc).__name__}:{str(exc)[:200]}")
        with self._lock:
            if key in self._seen:
                return True
            self._seen.append(key)
            return False

    def record(self, exc: BaseException, tb: Any = None, where: str = "", phase: str | None = None) -> None:
        """Record ``exc`` (an OOM) once. Never raises."""
        try:
            agent = self._agent()
            if agent is None or not agent.running or self.seen(exc):
                return
            self._record(agent, exc, tb if tb is not None else exc.__traceback__, where, phase)
        except Exception:
            pass

    def _record(self, agent: "CollectorHost", exc: BaseException, tb: Any, where: str, phase: str | None) -> None:
        step, step_start, tracker_phase = agent.current_step, agent.step_start, agent.phase
        mods = module_stack(tb)
        prefix = agent.module_prefix(mods[0]) if mods else ""
        names = _names(mods, prefix)
        types = [type(m).__name__ for m in mods]
        del mods
        if phase is None:
            # the traceback first: tracker.phase stays "optimizer" after a step() that raised
            if _in_optimizer(tb):
                phase = "optimizer"
            elif tracker_phase == "backward":
                phase = "backward"  # a forward recomputed inside backward is still backward
            elif names:
                phase = "forward"
            elif tracker_phase == "optimizer":
                phase = "optimizer"
            else:
                phase = "other"
        message = first_line(exc)
        requested, exact = parse_requested(str(exc))
        observed = self._observed.pop(threading.get_ident(), None)
        cuda = observed is not None or "cuda" in message.lower() or type(exc).__name__ == "OutOfMemoryError" \
            and "cpu" not in message.lower()
        data: dict[str, Any] = {
            "step": step, "phase": phase, "where": where,
            "module": names[-1] if names else None,
            "module_type": types[-1] if types else None,
            "module_stack": names, "exception": type(exc).__name__, "message": message,
            "requested_bytes": requested, "requested_exact": exact,
            "device": "cpu", "live_bytes": None, "rss": None,
            "reserved_bytes": None, "device_free_bytes": None, "device_total_bytes": None,
            "breakdown": agent.latest_breakdown(),
        }
        try:
            import psutil

            data["rss"] = agent.rss()
            data["host_total_bytes"] = psutil.virtual_memory().total
        except Exception:
            pass
        if cuda:
            data.update(_cuda_state(message, observed))
        else:
            data["live_bytes"] = data["rss"]
        self.count += 1
        agent.event("oom", f"{type(exc).__name__}: {message}", data)
        self.pending_failed = {"step": step, "start": step_start}

    def record_observed_leftovers(self, agent: "CollectorHost") -> None:
        """CUDA OOMs the observer saw but no exception capture did (caught inside a forward of
        a module no root hook covers): recorded from the observer's reading alone."""
        while self._observed:
            try:
                _tid, obs = self._observed.popitem()
            except KeyError:
                return
            data = {"step": agent.current_step, "phase": agent.phase
                    if agent.phase in ("backward", "optimizer") else "other",
                    "where": "cuda_observer", "module": None, "module_stack": [],
                    "message": f"CUDA out of memory on device {obs['device']}"
                               f" (requested {obs['requested_bytes']} bytes)",
                    "requested_bytes": obs["requested_bytes"], "requested_exact": True,
                    "device": f"cuda:{obs['device']}", "live_bytes": obs["device_allocated"],
                    "device_free_bytes": obs["device_free"], "breakdown": agent.latest_breakdown()}
            self.count += 1
            agent.event("oom", data["message"], data)


def _no_recorder() -> None:
    return None


class _RootHook:
    """The always-call forward hook on a root module: it holds the recorder weakly and looks
    only at the exception in flight, never at the output."""

    def __init__(self, recorder: OomRecorder) -> None:
        self._rec: Any = weakref.ref(recorder)

    # A model pickled whole (torch.save(model)) carries its hooks: pickle this one as an inert
    # hook instead of failing on the weak reference.
    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._rec = _no_recorder

    def __call__(self, module: Any, args: Any, output: Any) -> None:
        if output is not None:
            return None
        try:
            exc = sys.exc_info()[1]
            if exc is not None and is_oom(exc):
                rec = self._rec()
                if rec is not None:
                    rec.record(exc, exc.__traceback__, where="forward_hook")
        except Exception:
            pass
        return None


def _cuda_state(message: str, observed: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        import torch

        m = _CUDA_DEVICE.search(message)
        index = observed["device"] if observed else int(m.group(1)) if m else None
        if observed:
            out["requested_bytes"] = observed["requested_bytes"]
            out["requested_exact"] = True
            out["device_free_bytes"] = observed["device_free"]
        if torch.cuda.is_initialized():
            if index is None:
                index = torch.cuda.current_device()
            out["live_bytes"] = int(torch.cuda.memory_allocated(index))
            out["reserved_bytes"] = int(torch.cuda.memory_reserved(index))
            if "device_free_bytes" not in out:
                free, total = torch.cuda.mem_get_info(index)
                out["device_free_bytes"], out["device_total_bytes"] = int(free), int(total)
        elif observed:
            out["live_bytes"] = observed["device_allocated"]
        out["device"] = f"cuda:{index}" if index is not None else "cuda"
    except Exception as exc:
        out["cuda_error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:200]
    return out

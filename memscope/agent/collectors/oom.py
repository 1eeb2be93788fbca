"""Out-of-memory post-mortems, recorded inside the training process as the error happens.

An exception is an OOM when it is ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``)
or a ``RuntimeError`` whose message says "can't allocate memory" (the CPU allocator) or "out of
memory". It is recorded once (a mark on the exception) at the first of these places to see it,
each of them while the failing step's frames are still alive:

* the ``torch.autograd.backward`` wrapper of :mod:`memscope.agent.collectors.steps` (phase ``backward``);
* the armed global forward hooks and, with ``--catch-forward-oom``, the root-model hooks
  (:mod:`memscope.agent.collectors.oom_hooks`): forward OOMs, caught by the script or not;
* the optimizer-step guard (:mod:`memscope.agent.collectors.oom_hooks`): OOMs inside ``optimizer.step()``;
* ``sys.excepthook`` / ``threading.excepthook`` (chained to the previous hooks): any OOM nobody
  caught (its traceback still holds the frames).

Each record carries the step, phase, module path, requested bytes and an at-failure census of
the live tensors by category (:mod:`memscope.agent.collectors.oom_census`, bounded in time; the last profiled
step's breakdown only when the census could not run). On CUDA the allocator's OOM observer
(attached once CUDA is initialised) gives the exact requested size, and the allocator's counters,
its largest free cached block and NVML's view of the device are read at the record.

The exception is never changed or swallowed. Nothing here keeps a reference to the exception,
its traceback or a tensor past the call.
"""

from __future__ import annotations

import re
import resource
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from memscope.agent.collectors import cuda
from memscope.agent.collectors.oom_census import census
from memscope.agent.collectors.oom_hooks import (ARM_SHARE, ArmedHooks, RootHook, alloc_conf, guard_optimizers,
                                      host_limits, host_share, unguard_optimizers)
from memscope.units import human_bytes

if TYPE_CHECKING:
    from memscope.agent.collectors.host import CollectorHost

_CPU_REQUEST = re.compile(r"you tried to allocate (\d+) bytes")
_CUDA_REQUEST = re.compile(r"Tried to allocate ([\d.]+) ?([KMGTP]?i?B)", re.IGNORECASE)
_CUDA_DEVICE = re.compile(r"GPU (\d+)")
_UNITS = {"b": 1, "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4,
          "pib": 1024 ** 5, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4}
_MARK = "_memscope_oom_recorded"
OBSERVED_MAX_AGE_S = 30.0  # an observer reading from another thread older than this is another failure
MAX_CENSUSES = 8  # at-failure censuses per process (a batch-size finder retries many times)
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


def _frames(tb: Any) -> list[Any]:
    """The frames of a traceback, outermost first, with the frames still running outside it:
    a hook sees the exception while it unwinds, when its traceback starts at the hook's caller."""
    frames: list[Any] = []
    if tb is not None:
        f = tb.tb_frame.f_back
        while f is not None:
            frames.append(f)
            f = f.f_back
        frames.reverse()
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def module_stack(tb: Any) -> list[Any]:
    """Modules whose forward is on the traceback (or still running around it), outermost first
    (deduplicated)."""
    import torch

    out: list[Any] = []
    seen: set[int] = set()
    frames = _frames(tb)
    for frame in frames:
        code = frame.f_code
        if code.co_name in _MODULE_FRAMES and "self" in code.co_varnames:
            try:
                obj = frame.f_locals.get("self")
            except Exception:
                obj = None
            if isinstance(obj, torch.nn.Module) and id(obj) not in seen:
                seen.add(id(obj))
                out.append(obj)
            del obj
    frames.clear()
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


def optimizer_of(tb: Any) -> dict[str, Any] | None:
    """The optimizer whose step() the traceback went through: its class, the bytes of its
    trainable parameters and of the state it had built when the step failed (Adam builds its
    state at its first step: a step 0 that ran out of memory had built part of it)."""
    import torch

    while tb is not None:
        frame = tb.tb_frame
        if "self" in frame.f_code.co_varnames:
            try:
                opt = frame.f_locals.get("self")
            except Exception:
                opt = None
            if isinstance(opt, torch.optim.Optimizer):
                params = [p for g in opt.param_groups for p in g.get("params", [])
                          if isinstance(p, torch.Tensor) and p.requires_grad]
                state = [v for st in list(opt.state.values()) if isinstance(st, dict)
                         for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
                out = {"class": type(opt).__name__,
                       "trainable_bytes": sum(p.numel() * p.element_size() for p in params),
                       "state_bytes": sum(v.numel() * v.element_size() for v in state)}
                params.clear()
                state.clear()
                return out
            del opt
        tb = tb.tb_next
    return None


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
        self.failed = 0  # OOMs whose record failed (each said in a recording_degraded event)
        self.censuses = 0
        self._prev_excepthook: Any = None
        self._prev_thread_hook: Any = None
        self._hooked_roots: dict[int, tuple[weakref.ReferenceType[Any], Any]] = {}
        self._observer_attached = False
        self._observed: dict[int, dict[str, Any]] = {}  # thread id -> observer's last reading
        self.armed = ArmedHooks(self.on_exception)
        self._limits = host_limits()
        self._oom_in_step = False  # an OOM was recorded in the step in progress

    # -- install / remove ----------------------------------------------------------------------

    def install(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_thread_hook = threading.excepthook
        threading.excepthook = self._thread_excepthook
        guard_optimizers(self.on_exception)
        self.armed.arm()  # step 0: see its forward OOMs and find the models

    def remove(self) -> None:
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook or sys.__excepthook__
        if threading.excepthook == self._thread_excepthook:
            threading.excepthook = self._prev_thread_hook or threading.__excepthook__
        self.armed.disarm()
        unguard_optimizers()
        for _ref, handle in list(self._hooked_roots.values()):
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

    def on_exception(self, exc: BaseException, where: str) -> None:
        """An exception seen in flight by a hook (forward, optimizer step): recorded if an OOM."""
        try:
            if is_oom(exc):
                self.record(exc, exc.__traceback__, where=where,
                            phase="optimizer" if where == "optimizer" else None)
        except Exception:
            pass

    # -- step boundaries -----------------------------------------------------------------------

    def step_closed(self, memory_share: float, profiled_next: bool, roots: list[Any] | None,
                    catch_forward: bool) -> None:
        """At a step boundary: arm the global hooks for the next step or not (see oom_hooks),
        and with ``--catch-forward-oom`` hook the root models found so far. ``roots``: models
        found elsewhere (the layer profiler's) since the last boundary, None when none can be."""
        if roots:
            self.armed.see_roots(roots)
        arm = (profiled_next or memory_share >= ARM_SHARE or self._oom_in_step) and not self.armed.compiled
        self._oom_in_step = False
        self.armed.new_step()
        if arm:
            self.armed.arm()
        else:
            self.armed.disarm()
        if catch_forward:
            self.hook_roots(self.armed.live_roots())

    def host_share(self, rss: int | None, vms: int | None) -> float:
        return host_share(self._limits, rss, vms)

    # -- root forward hooks (--catch-forward-oom) ----------------------------------------------

    def hook_roots(self, roots: list[Any]) -> None:
        """A forward hook that always runs on each root module not hooked yet."""
        for root in roots:
            rid = id(root)
            entry = self._hooked_roots.get(rid)
            if entry is not None and entry[0]() is root:
                continue
            try:
                handle = root.register_forward_hook(RootHook(self.on_exception), always_call=True)
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

        # Called by the allocator at the failure, its lock released: (device, requested bytes,
        # the memory it may use: the device's total or the per-process fraction's cap, free
        # bytes the driver reported). Only numbers are kept.
        def observer(device: int, alloc: int, device_limit: int, device_free: int) -> None:
            rec = ref()
            if rec is not None:
                rec._observed[threading.get_ident()] = {
                    "device": int(device), "requested_bytes": int(alloc),
                    "device_limit": int(device_limit), "device_free": int(device_free),
                    "t": time.time()}

        attach(observer)

    def _take_observed(self, requested: int | None) -> dict[str, Any] | None:
        """The observer's reading of this failure. The allocator calls the observer on the thread
        that allocated: a CUDA backward allocates on the autograd engine's device thread, not on
        the thread that raises, so a reading from another thread is taken when it is recent and
        its size is the message's (rounded to two decimals there); else it would be recorded a
        second time as a leftover."""
        mine = self._observed.pop(threading.get_ident(), None)
        if mine is not None:
            return mine
        now = time.time()
        for tid, obs in sorted(self._observed.items(), key=lambda kv: -kv[1]["t"]):
            size = obs["requested_bytes"]
            if now - obs["t"] > OBSERVED_MAX_AGE_S:
                continue
            if requested is None or abs(size - requested) <= 0.006 * size + 1024:
                return self._observed.pop(tid, None)
        return None

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
        except Exception as failure:
            self.failed += 1  # not silent: the run file says an OOM went unrecorded, and why
            try:
                agent = self._agent()
                if agent is not None:
                    what = f"{type(exc).__name__}: {str(exc)[:200]}"
                    why = f"{type(failure).__name__}: {str(failure)[:200]}"
                    agent.event("recording_degraded",
                                f"recording degraded: an out-of-memory error ({what}) could not be recorded ({why})",
                                {"source": "oom", "exception": what, "error": why, "failed": self.failed})
            except Exception:
                pass

    def _record(self, agent: "CollectorHost", exc: BaseException, tb: Any, where: str, phase: str | None) -> None:
        step, step_start, tracker_phase = agent.current_step, agent.step_start, agent.phase
        mods = module_stack(tb)
        prefix = agent.module_prefix(mods[0]) if mods else ""
        names = _names(mods, prefix)
        types = [type(m).__name__ for m in mods]
        # the model in eval mode while autograd saved activations: an evaluation without no_grad
        training = bool(getattr(mods[0], "training", True)) if mods else None
        if mods:
            self.armed.see_roots([mods[0]])
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
        observed = self._take_observed(requested)
        cuda = observed is not None or "cuda" in message.lower() or type(exc).__name__ == "OutOfMemoryError" \
            and "cpu" not in message.lower()
        data: dict[str, Any] = {
            "step": step, "phase": phase, "where": where,
            "module": names[-1] if names else None,
            "module_type": types[-1] if types else None,
            "module_stack": names, "training": training, "exception": type(exc).__name__, "message": message,
            "requested_bytes": requested, "requested_exact": exact,
            "device": "cpu", "live_bytes": None, "rss": None,
            "reserved_bytes": None, "device_free_bytes": None, "device_total_bytes": None,
        }
        try:
            import psutil

            data["rss"] = agent.rss()
            data["host_total_bytes"] = psutil.virtual_memory().total
            data["vms"] = int(psutil.Process().memory_info().vms)
        except Exception:
            pass
        data["limits"] = _limits_now(self._limits, agent)
        if phase == "optimizer":
            data["optimizer"] = optimizer_of(tb)
        if cuda:
            data.update(_cuda_state(agent, message, observed))
        else:
            data["live_bytes"] = data["rss"]
        data.update(self._breakdown(agent, data["device"], step))
        self.count += 1
        self._oom_in_step = True
        agent.event("oom", f"{type(exc).__name__}: {message}", data)
        self.pending_failed = {"step": step, "start": step_start}

    def _breakdown(self, agent: "CollectorHost", device: str, step: int) -> dict[str, Any]:
        """What was live at the failure (the census), else the last profiled step's breakdown,
        saying which it is."""
        older = agent.latest_breakdown()
        out: dict[str, Any] = {"profiled_breakdown": older}
        counted = None
        if self.censuses < MAX_CENSUSES:
            self.censuses += 1
            roots = [(r, agent.module_prefix(r)) for r in self.armed.live_roots()]
            counted = census(device if device.startswith("cuda") else "cpu", agent.optimizers(),
                             roots, self.armed.log())
            del roots
        if counted is not None:
            by_module = counted.pop("activations_by_module")
            keys = ("parameters", "gradients", "optimizer_state", "activations", "other")
            out["breakdown"] = {k: counted[k] for k in keys}
            out["breakdown_step"] = step
            out["breakdown_at_failure"] = True
            out["activations_by_module"] = by_module
            out["census"] = {k: v for k, v in counted.items() if k not in keys}
        else:
            out["breakdown"] = {k: v for k, v in older.items() if k != "step"} if older else None
            out["breakdown_step"] = older.get("step") if older else None
            out["breakdown_at_failure"] = False
            out["census"] = {"skipped": "limit of censuses per process reached"
                             if self.censuses >= MAX_CENSUSES else "the census failed"}
        return out

    def record_observed_leftovers(self, agent: "CollectorHost") -> None:
        """CUDA OOMs the observer saw but no exception capture did (caught inside a forward
        the hooks did not cover): recorded from the observer's reading alone."""
        while self._observed:
            try:
                _tid, obs = self._observed.popitem()
            except KeyError:
                return
            older = agent.latest_breakdown()
            data = {"step": agent.current_step, "phase": agent.phase
                    if agent.phase in ("backward", "optimizer") else "other",
                    "where": "cuda_observer", "module": None, "module_stack": [],
                    "message": f"CUDA out of memory on device {obs['device']}"
                               f" (requested {human_bytes(obs['requested_bytes'])})",
                    "requested_bytes": obs["requested_bytes"], "requested_exact": True,
                    "device": f"cuda:{obs['device']}", "live_bytes": None,
                    "device_free_bytes": obs["device_free"], "device_limit_bytes": obs["device_limit"],
                    "breakdown": {k: v for k, v in older.items() if k != "step"} if older else None,
                    "breakdown_step": older.get("step") if older else None,
                    "breakdown_at_failure": False}
            self.count += 1
            agent.event("oom", data["message"], data)


def _limits_now(limits: dict[str, int | None], agent: "CollectorHost") -> dict[str, int]:
    """The memory limits in force at the failure, by name: the address-space rlimit
    (``ulimit -v``, read again: a script may lower it), the cgroup's memory.max, the machine's
    memory, ``--simulate-gpu``'s cap. memscope.analysis.oom decides which one failed."""
    out = {"RLIMIT_AS": limits.get("address_space"), "cgroup_memory_max": limits.get("cgroup"),
           "host_memory": limits.get("host_total")}
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        out["RLIMIT_AS"] = int(soft) if soft != resource.RLIM_INFINITY and soft > 0 else None
    except (ValueError, OSError):
        pass
    try:
        size = agent.options.simulate_gpu
        out["simulate_gpu"] = int(size) if size else None
    except Exception:
        pass
    return {k: int(v) for k, v in out.items() if v}


def _segments(torch: Any, index: int) -> list[dict[str, Any]] | None:
    """The allocator's segments on device ``index`` (for the largest free block), without the
    history's trace entries where this torch can leave them out (they can be many)."""
    try:
        try:
            segments = torch.cuda.memory_snapshot(include_traces=False)
        except TypeError:  # a torch before include_traces
            segments = torch.cuda.memory_snapshot()
        return [s for s in segments if s.get("device") == index]
    except Exception:
        return None


def _cuda_state(agent: "CollectorHost", message: str, observed: dict[str, Any] | None) -> dict[str, Any]:
    """The allocator at the failure: counters, the largest free cached block, the driver's free
    and total, NVML's view of the device (memory outside PyTorch). Only numbers."""
    out: dict[str, Any] = {}
    try:
        import torch

        m = _CUDA_DEVICE.search(message)
        index = observed["device"] if observed else int(m.group(1)) if m else None
        if observed:
            out["requested_bytes"] = observed["requested_bytes"]
            out["requested_exact"] = True
            out["device_free_bytes"] = observed["device_free"]
            out["device_limit_bytes"] = observed["device_limit"]
        if torch.cuda.is_initialized():
            if index is None:
                index = torch.cuda.current_device()
            stats = torch.cuda.memory_stats(index)
            segments = _segments(torch, index)
            state = cuda.allocator_state(stats, segments)
            del segments
            out.update(state)
            out["live_bytes"] = state.get("allocated_bytes")
            free, total = torch.cuda.mem_get_info(index)
            out.setdefault("device_free_bytes", int(free))
            out["device_total_bytes"] = int(total)
            nv = agent.nvml_memory(index)
            if nv is not None:
                out.update(cuda.outside_pytorch(nv.get("used"), nv.get("total"),
                                                state.get("reserved_bytes"), nv.get("process_used")))
        elif observed:
            out["live_bytes"] = None
        out["alloc_conf"] = alloc_conf()
        out["expandable_segments"] = bool(out.get("expandable_segments")) or \
            cuda.expandable_segments(out["alloc_conf"])
        out["device"] = f"cuda:{index}" if index is not None else "cuda"
    except Exception as exc:
        out["cuda_error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:200]
    return out

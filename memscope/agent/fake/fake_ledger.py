"""The accounting of a fake run (``memscope estimate`` / ``memscope fit``): every tensor storage
the script creates under FakeTensorMode, with its size, without the memory.

:class:`Ledger` mirrors the exact live-tensor counter ``whatif`` measures real runs with
(memscope.agent.collectors.tensor_peak.TensorPeak): a storage is counted once when an op returns it and
subtracted when it dies (a weakref callback on the storage object, which Python keeps while the
storage lives). It also keeps what a plan needs: each storage's category (parameters,
gradients, optimizer state, activations saved for backward, other), the live set at the peak,
the bytes each module saved, and the FLOPs of the step (for the recompute cost of
checkpointing). :class:`Accounting` is the TorchDispatchMode that feeds it; it sits above the
FakeTensorMode, so it sees the ops autograd and autocast issue, as the real counter does.

Data-dependent scalars (``loss.item()``, ``float(loss)``, ``f"{loss:.4f}"``) get a placeholder:
a float read by the script is 1.0 (a loss: ``math.log`` and ``1 / loss`` work with it), one
read by torch itself 0.0 (GradScaler's found-inf flag: no overflow), an integer 0 (an index or
a count), a truth value False; each use is counted with the script line that asked.
``nonzero``, ``masked_select`` and ``unique``, whose output size depends on the values, get
their largest possible size (every element selected).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memscope.agent.fake.fake_devices import Devices, rounded
from memscope.agent.fake.fake_values import Values
from memscope.agent.torchcompat.storages import storages

aten = torch.ops.aten
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")
_RANK = {"parameters": 0, "optimizer_state": 1, "gradients": 2, "activations": 3}


# ops that read a value out of a tensor: a fake tensor has none, so they get a placeholder
_SCALAR_READS = (aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default)


class Ledger:
    def __init__(self) -> None:
        self.live: dict[int, tuple[int, int]] = {}  # id(storage) -> (serial, nbytes)
        self._refs: dict[int, weakref.ReferenceType[Any]] = {}
        self._lock = threading.RLock()  # a callback can fire inside add() on the same thread
        self.serial = 0
        self.total = 0
        self.total_rounded = 0
        self.peak = 0
        self.peak_rounded = 0
        self.step_peak = 0
        self.step_peak_rounded = 0
        self.category: dict[int, str] = {}  # serial -> category
        self.nbytes: dict[int, int] = {}  # serial -> bytes, for the snapshot
        self.peak_live: list[int] = []  # serials live at the (exact) peak
        self._pending = False  # the peak rose since the last snapshot
        self.saved_live = 0  # bytes of storages saved for backward that autograd still holds
        self.saved_peak = 0  # their most in the step
        self.saved_by_module: dict[str, int] = {}  # this step: module -> bytes it saved first
        self._saved_serials: set[int] = set()  # serials saved in this step (charged once)
        self.buffers: set[int] = set()  # serials of the models' buffers: not activations
        self._aliases: dict[int, int] = {}  # serial -> saved aliases alive (autograd holds them)
        self._alias_refs: set[weakref.ReferenceType[Any]] = set()
        self.flops = 0
        self.unsized_sparse: set[int] = set()  # sparse tensors of unknown size: not counted
        self.devices = Devices()

    # -- storages --------------------------------------------------------------------------------

    def add(self, t: Any, device: str | None = None) -> int | None:
        """Count ``t``'s storages if they are new (a sparse tensor's indices and values: two);
        the serial of the last (None: not a countable tensor). ``device``: where it is when that
        is not ``t.device`` (a pretend GPU's tensors)."""
        try:
            parts = storages(t)
        except Exception:
            return None  # a subclass without storage
        where = device or self.devices.target or t.device.type
        serial = None
        for st, n in parts:
            serial = self._add_storage(st, n, where)
        if parts and t.layout is not torch.strided and not any(n for _, n in parts):
            self.unsized_sparse.add(id(parts[-1][0]))  # a fake sparse tensor's nnz is unknown
        return serial

    def _add_storage(self, st: Any, n: int, device: str) -> int:
        key = id(st)
        with self._lock:
            entry = self.live.get(key)
            if entry is not None:
                return entry[0]
            self.serial += 1
            serial = self.serial
            self.live[key] = (serial, n)
            self.nbytes[serial] = n
            self.total += n
            self.total_rounded += rounded(n)
            if self.total > self.peak:
                self.peak = self.total
                self._pending = True
            if self.total > self.step_peak:
                self.step_peak = self.total
            self.peak_rounded = max(self.peak_rounded, self.total_rounded)
            self.step_peak_rounded = max(self.step_peak_rounded, self.total_rounded)
            self._refs[key] = weakref.ref(st, self._released(key))
            self.devices.add(serial, n, device)
        return serial

    def add_tree(self, obj: Any, device: str | None = None, depth: int = 0) -> None:
        if isinstance(obj, torch.Tensor):
            self.add(obj, device)
        elif depth < 3 and isinstance(obj, (tuple, list)):
            for o in obj:
                self.add_tree(o, device, depth + 1)

    def device_of(self, obj: Any, depth: int = 0) -> str | None:
        """"cuda" when a tensor in ``obj`` (an op's arguments) is on the GPU, else None."""
        if isinstance(obj, torch.Tensor):
            serial = self.serial_of(obj)
            return "cuda" if serial is not None and self.devices.of.get(serial) == "cuda" else None
        if depth < 2 and isinstance(obj, (tuple, list)):
            for o in obj:
                if self.device_of(o, depth + 1):
                    return "cuda"
        return None

    def move(self, t: Any, device: str) -> None:
        """``t``'s storage is now on ``device`` (memscope.agent.fake.fake_devices)."""
        with self._lock:
            serial = self.serial_of(t)
            if serial is None:
                serial = self.add(t, device)
            if serial is not None:
                self.devices.move(serial, self.nbytes[serial], device, self.live)

    def serial_of(self, t: Any) -> int | None:
        try:
            parts = storages(t)
        except Exception:
            return None
        entry = self.live.get(id(parts[-1][0])) if parts else None
        return entry[0] if entry else None

    def _released(self, key: int) -> Callable[[Any], None]:
        def callback(ref: Any) -> None:
            with self._lock:
                if self._refs.get(key) is not ref:
                    return
                del self._refs[key]
                serial, n = self.live[key]
                self.devices.release(serial, n, self.live)
                del self.live[key]
                if self._pending:  # the moment after the peak: remember what was live
                    self.peak_live = [s for s, _ in self.live.values()] + [serial]
                    self._pending = False
                self.total -= n
                self.total_rounded -= rounded(n)
        return callback

    # -- categories ------------------------------------------------------------------------------

    def claim(self, t: Any, category: str) -> int:
        """Mark ``t``'s storage as ``category`` (parameters first, then optimizer state,
        gradients, activations: a storage keeps the strongest claim); its bytes if counted."""
        if t.layout is not torch.strided and self.add(t) is not None:  # sparse: each part
            entries = [self.live.get(id(st)) for st, _ in storages(t)]
            return sum(self._claim(e[0], category) for e in entries if e is not None)
        serial = self.serial_of(t)
        if serial is None:
            serial = self.add(t)
            if serial is None:
                return 0
        return self._claim(serial, category)

    def _claim(self, serial: int, category: str) -> int:
        with self._lock:
            old = self.category.get(serial)
            if old is None or _RANK[category] < _RANK[old]:
                self.category[serial] = category
                if old == "activations" and serial in self._aliases:
                    self._aliases.pop(serial)  # not an activation after all (a parameter's view)
                    self.saved_live -= self.nbytes[serial]
        return self.nbytes.get(serial, 0)

    def saved(self, t: Any, module: str) -> Any:
        """A tensor autograd saves for backward, inside ``module``'s forward; returns what
        autograd should keep. As the agent's layer profiler does (memscope.agent.collectors.layers), that
        is a detached alias (the same storage): keeping ``t`` itself would tie an output saved
        by its own grad_fn to its graph in a cycle gc cannot see. Saved bytes are alive while an
        alias of their storage is (the graph holds them), counted once per storage."""
        alias = t.detach()
        serial = self.serial_of(t)
        if serial is None:
            serial = self.add(t)
            if serial is None:
                return alias
        if serial in self.buffers:
            return alias
        with self._lock:
            if self.category.get(serial) is None:
                self.category[serial] = "activations"
            if self.category[serial] != "activations":
                return alias
            n = self.nbytes[serial]
            count = self._aliases.get(serial, 0)
            self._aliases[serial] = count + 1
            if count == 0:
                self.saved_live += n
                self.saved_peak = max(self.saved_peak, self.saved_live)
                if serial not in self._saved_serials:
                    self._saved_serials.add(serial)
                    self.saved_by_module[module] = self.saved_by_module.get(module, 0) + n
            self._alias_refs.add(weakref.ref(alias, self._unsaved(serial)))
        return alias

    def _unsaved(self, serial: int) -> Callable[[Any], None]:
        def callback(ref: Any) -> None:
            with self._lock:
                self._alias_refs.discard(ref)
                if serial not in self._aliases:
                    return  # no longer counted (claimed as a parameter's)
                count = self._aliases[serial] - 1
                if count > 0:
                    self._aliases[serial] = count
                    return
                self._aliases.pop(serial, None)
                self.saved_live -= self.nbytes.get(serial, 0)
        return callback

    # -- steps -----------------------------------------------------------------------------------

    def close_step(self) -> dict[str, Any]:
        """The figures of the step that just ended; the next one starts from what is live."""
        with self._lock:
            out = {"peak_bytes": self.step_peak, "peak_rounded_bytes": self.step_peak_rounded,
                   "activations": self.saved_peak, "flops": self.flops,
                   "saved_by_module": dict(self.saved_by_module), "end_bytes": self.total,
                   "peak_by_device": self.devices.close_step()}
            self.step_peak, self.step_peak_rounded = self.total, self.total_rounded
            self.saved_peak = self.saved_live
            self.saved_by_module, self._saved_serials = {}, set()
            self.flops = 0
        return out

    def peak_by_device(self) -> dict[str, dict[str, Any]]:
        """Each device's own peak (exact and rounded to 512 B) and what was live on it then."""
        return {d: {"peak_bytes": c.peak, "peak_rounded_bytes": c.peak_rounded,
                    "breakdown": self.peak_breakdown(d)}
                for d, c in sorted(self.devices.counters.items()) if c.peak}

    def peak_breakdown(self, device: str | None = None) -> dict[str, int]:
        """Bytes by category of what was live at the peak (categories as finally claimed);
        with ``device``, of that device's tensors at that device's peak."""
        with self._lock:
            if device is not None:
                live = self.devices.snapshot(device, self.live)
            else:
                live = self.peak_live if not self._pending else [s for s, _ in self.live.values()]
            out = dict.fromkeys(CATEGORIES, 0)
            for s in live:
                out[self.category.get(s, "other")] += self.nbytes.get(s, 0)
        return out


class Accounting(TorchDispatchMode):
    """Counts every storage an op returns; answers data-dependent ops with placeholders."""

    def __init__(self, ledger: Ledger, script: str) -> None:
        super().__init__()
        self.ledger = ledger
        self.script = script
        self.placeholders: dict[str, dict[str, Any]] = {}  # site -> {"kind", "count"}
        self.flop_counter = _flop_registry()
        self.values = Values(ledger.serial_of, lambda t: placeholder_value(t.dtype))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _SCALAR_READS:
            try:
                return func(*args, **kwargs)  # a constant the fake mode still knows (a step count)
            except Exception:
                return self._read(args[0], func)
        out: Any
        if func is aten.nonzero.default:
            x = args[0]
            out = torch.empty((x.numel(), x.dim()), dtype=torch.long, device=x.device)
            self._note("nonzero (all elements taken as selected)", "size")
        elif func is aten._unique2.default:
            x = args[0]
            inverse, counts = _flag(args, kwargs, 2, "return_inverse"), _flag(args, kwargs, 3, "return_counts")
            n = x.numel()
            out = (torch.empty((n,), dtype=x.dtype, device=x.device),
                   torch.empty(tuple(x.shape) if inverse else (0,), dtype=torch.long, device=x.device),
                   torch.empty((n,) if counts else (0,), dtype=torch.long, device=x.device))
            self._note("unique (every element taken as distinct)", "size")
        elif func is aten.masked_select.default:
            x, mask = args[0], args[1]
            n = torch.broadcast_shapes(x.shape, mask.shape).numel()
            out = torch.empty((n,), dtype=x.dtype, device=x.device)
            self._note("masked_select (all elements taken as selected)", "size")
        else:
            out = func(*args, **kwargs)
        self.ledger.add_tree(out, self.ledger.device_of(args))
        self.values.follow(func, args, kwargs, out)
        flop = self.flop_counter.get(getattr(func, "_overloadpacket", None))
        if flop is not None:
            try:
                self.ledger.flops += int(flop(*args, **kwargs, out_val=out))
            except Exception:
                pass
        return out

    def _read(self, t: Any, func: Any) -> Any:
        """A value read from a fake tensor: the one it was computed to have from earlier
        placeholders (memscope.agent.fake.fake_values), else a new placeholder, remembered."""
        known, value = self.values.read(t)
        if known:
            if func is not aten._local_scalar_dense.default or t.dtype is torch.bool:
                value = bool(value)
            else:
                value = float(value) if t.dtype.is_floating_point else int(value)
            self._note(f"{type(value).__name__} scalar read from a tensor (.item(), float(), if t:)",
                       type(value).__name__)
            return value
        value = self._placeholder(t, func)
        if func is aten._local_scalar_dense.default:
            self.values.remember(t, value)
        return value

    def _placeholder(self, t: Any, func: Any) -> Any:
        value = placeholder_value(t.dtype, func is not aten._local_scalar_dense.default)
        if isinstance(value, float) and _asked_by_torch():
            value = 0.0
        self._note(f"{type(value).__name__} scalar read from a tensor (.item(), float(), if t:)",
                   type(value).__name__)
        return value

    def _note(self, what: str, kind: str, count: int = 1) -> None:
        site = user_site(self.script)
        entry = self.placeholders.setdefault(f"{site}: {what}", {"kind": kind, "count": 0})
        entry["count"] += count

    def install_conversions(self) -> None:
        """``tensor.tolist()`` and ``tensor.numpy()`` of a fake tensor: placeholders of the
        right shape (a shuffled sampler's ``randperm(n).tolist()``, metrics in numpy), in one
        call rather than one scalar read per element."""
        from torch._subclasses.fake_tensor import FakeTensor

        numpy = torch.Tensor.numpy
        accounting = self

        def fake_tolist(t: Any) -> Any:
            value = placeholder_value(t.dtype)
            accounting._note("tolist() of a tensor: placeholders", "list", max(1, t.numel()))

            def build(shape: list[int]) -> Any:
                return [build(shape[1:]) for _ in range(shape[0])] if shape else value
            return build(list(t.shape))

        def fake_numpy(t: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(t, FakeTensor):
                return numpy(t, *args, **kwargs)
            import numpy as np

            accounting._note("numpy() of a tensor: placeholders", "array", max(1, t.numel()))
            name = str(t.dtype).replace("torch.", "")
            return np.full(tuple(t.shape), placeholder_value(t.dtype),
                           dtype=name if hasattr(np, name) else "float32")

        def fake_format(t: Any, spec: str) -> str:
            # Tensor.__format__ formats the value of a 0-dim tensor of type Tensor only
            if t.dim() == 0:
                return format(t.item(), spec)
            return tensor_format(t, spec)

        tensor_format = torch.Tensor.__format__
        FakeTensor.__format__ = fake_format  # type: ignore[method-assign]
        FakeTensor.tolist = fake_tolist  # type: ignore[method-assign,assignment]
        torch.Tensor.numpy = fake_numpy  # type: ignore[method-assign,assignment]


_DISPATCH = ("/torch/_ops.py", "/torch/_subclasses/", "/torch/utils/_python_dispatch.py",
             "/torch/_tensor.py", "/torch/overrides.py", "/torch/_prims", "/torch/_decomp", "/torch/_refs",
             "/torch/_dynamo/", "/torch/_compile.py")


def _asked_by_torch() -> bool:
    """Whether the code reading a value is torch's own (below memscope and the dispatch)."""
    f: Any = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if "/memscope/" not in name and not any(d in name for d in _DISPATCH):
            return "/torch/" in name
        f = f.f_back
    return False


def _flag(args: Any, kwargs: Any, index: int, name: str) -> bool:
    return bool(kwargs[name] if name in kwargs else (args[index] if len(args) > index else False))


def placeholder_value(dtype: Any, boolean: bool = False) -> Any:
    """What a fake tensor's value reads as: 1.0 (a float, positive and nonzero: a loss that is
    logged, divided by, exponentiated), 0 (an integer) or False."""
    if boolean or dtype is torch.bool:
        return False
    if dtype.is_floating_point or dtype.is_complex:
        return 1.0
    return 0


def user_site(script: str) -> str:
    """``file:line`` of the innermost frame outside torch and memscope (the script's line)."""
    f = sys._getframe(2)
    fallback = None
    while f is not None:
        name = f.f_code.co_filename
        if "/torch/" not in name and "/memscope/" not in name and not name.startswith("<"):
            return f"{_short(name, script)}:{f.f_lineno}"
        if fallback is None and name == script:
            fallback = f"{_short(name, script)}:{f.f_lineno}"
        f = f.f_back  # type: ignore[assignment]
    return fallback or "?"


def _short(name: str, script: str) -> str:
    import os

    if "site-packages/" in name:  # a library's line: its package path
        return name.rsplit("site-packages/", 1)[1]
    try:
        rel = os.path.relpath(name)
    except ValueError:
        return name
    return rel if not rel.startswith("..") else name


def _flop_registry() -> dict[Any, Any]:
    try:
        from torch.utils.flop_counter import flop_registry

        return dict(flop_registry)
    except Exception:
        return {}

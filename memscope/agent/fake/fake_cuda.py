"""A CUDA GPU for a fake run on a machine without one (``memscope estimate`` / ``fit``).

A CPU build of torch cannot hold fake CUDA tensors (autograd asks for a CUDA device guard the
build does not have), so the pretence is one level up: the script is told there is one GPU
(``torch.cuda.is_available()`` is True, ``device_count()`` 1, ``get_device_properties`` says
the planned size), and every tensor it sends to ``"cuda"`` (``.cuda()``, ``.to("cuda")``,
``device="cuda"``, ``pin_memory()``) stays a fake tensor on the CPU side. Byte counts do not
depend on the device; which tensors the script put on the GPU is kept beside them
(memscope.agent.fake.fake_devices), so tensors it keeps on the CPU are not counted as GPU memory.
``torch.autocast("cuda")`` becomes CPU autocast with the same dtype (CUDA's default there, float16). Allocator queries
(``torch.cuda.max_memory_allocated`` ...) answer from the fake run's own ledger.

What this cannot make the same: code paths chosen by the tensor's device (``x.is_cuda`` is
False; fused kernels pick CPU variants), CUDA streams and events (no-ops), NCCL.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(d: Any) -> bool:
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d == "cuda" or d.startswith("cuda:")
    return False


def _cpu(d: Any) -> Any:
    return "cpu" if _is_cuda(d) or (isinstance(d, int) and not isinstance(d, bool)) else d


class CudaOnCpu(TorchFunctionMode):
    """Rewrites CUDA devices to the CPU in every torch call the script makes, and tells the
    ledger (``placement``, memscope.agent.fake.fake_devices) which storages the script put on the
    GPU: those a call naming a CUDA device made or moved."""

    def __init__(self, placement: Any = None) -> None:
        super().__init__()
        self.placement = placement

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        to_cuda = False
        if func is torch.Tensor.cuda:
            non_blocking = kwargs.get("non_blocking", False)
            func, args, kwargs, to_cuda = torch.Tensor.to, (args[0], "cpu"), {"non_blocking": non_blocking}, True
        if func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.Tensor.is_pinned:
            return False
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = {**kwargs, "device": "cpu"}
            to_cuda = True
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
            to_cuda = True
        if not to_cuda or self.placement is None:
            return func(*args, **kwargs)
        devices = self.placement.devices
        outer, devices.target = devices.target, "cuda"
        try:
            out = func(*args, **kwargs)
        finally:
            devices.target = outer
        if func is torch.Tensor.to and isinstance(out, torch.Tensor):
            self.placement.move(out, "cuda")  # the same fake storage as the CPU tensor it was
        return out


class _Event:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, *args: Any, **kwargs: Any) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


class _Stream(_Event):
    def wait_stream(self, *args: Any) -> None:
        pass

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def install(total_memory: int, allocated: Callable[[], int], peak: Callable[[], int],
            placement: Any = None) -> CudaOnCpu:
    """Pretend one GPU of ``total_memory`` bytes; returns the mode to enter around the run.
    ``placement`` (the fake run's ledger) learns which storages are on the GPU."""
    cuda = torch.cuda
    props = SimpleNamespace(name="memscope fake GPU", total_memory=total_memory, major=9, minor=0,
                            multi_processor_count=132, is_integrated=False, is_multi_gpu_board=False,
                            L2_cache_size=50 << 20, uuid="fake")

    def const(value: Any) -> Callable[..., Any]:
        # one function object per name: torch._dynamo's trace rules refuse one object under
        # two names with different rules
        def f(*args: Any, **kwargs: Any) -> Any:
            return value
        return f

    patches: dict[str, Any] = {
        "is_available": const(True),
        "device_count": const(1),
        "current_device": const(0),
        "set_device": const(None),
        "is_initialized": const(True),
        "_lazy_init": const(None),
        "init": const(None),
        "synchronize": const(None),
        # optimizers ask before each step (a real CUDA call on a CUDA build: "no CUDA-capable
        # device is detected" with the GPU hidden, seen on an H100 machine)
        "is_current_stream_capturing": const(False),
        "empty_cache": const(None),
        "ipc_collect": const(None),
        "get_device_name": const(props.name),
        "get_device_capability": const((props.major, props.minor)),
        "get_device_properties": const(props),
        "is_bf16_supported": const(True),
        "manual_seed": const(None),
        "manual_seed_all": const(None),
        "seed": const(None),
        "seed_all": const(None),
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "get_rng_state_all": lambda *a, **k: [torch.get_rng_state()],
        "set_rng_state": const(None),
        "set_rng_state_all": const(None),
        "memory_allocated": lambda *a, **k: allocated(),
        "max_memory_allocated": lambda *a, **k: peak(),
        "memory_reserved": lambda *a, **k: allocated(),
        "max_memory_reserved": lambda *a, **k: peak(),
        "reset_peak_memory_stats": const(None),
        "reset_max_memory_allocated": const(None),
        "reset_accumulated_memory_stats": const(None),
        "mem_get_info": lambda *a, **k: (max(0, total_memory - allocated()), total_memory),
        "Event": _Event,
        "Stream": _Stream,
        "current_stream": lambda *a, **k: _Stream(),
        "default_stream": lambda *a, **k: _Stream(),
        "stream": lambda *a, **k: _Stream(),
    }
    for name, value in patches.items():
        setattr(cuda, name, value)
    cuda.device = _device_context  # type: ignore[assignment,misc]
    try:
        import torch.cuda.amp.common as amp_common

        amp_common.amp_definitely_not_available = lambda: False
    except Exception:
        pass
    _autocast_on_cpu()
    return CudaOnCpu(placement)


class _device_context:
    def __init__(self, device: Any) -> None:
        pass

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: Any) -> None:
        pass


def _autocast_on_cpu() -> None:
    """``torch.autocast("cuda", dtype)`` (and ``torch.cuda.amp.autocast``) runs as CPU autocast
    with the dtype CUDA would use."""
    cls = torch.amp.autocast_mode.autocast
    orig = cls.__init__

    def __init__(self: Any, device_type: str, dtype: Any = None, enabled: bool = True,
                 cache_enabled: Any = None) -> None:
        if device_type == "cuda":
            dtype = dtype if dtype is not None else torch.get_autocast_dtype("cuda")
            device_type = "cpu"
        orig(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    cls.__init__ = __init__  # type: ignore[method-assign]

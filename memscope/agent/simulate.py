"""``--simulate-gpu SIZE``: run on a big GPU as if it had only SIZE of memory (issue #5).

The cap is ``torch.cuda.set_per_process_memory_fraction(SIZE / total, device)`` on every visible
device, handed to ``torch.cuda._lazy_call``: torch runs it inside its own lazy CUDA
initialisation, the moment the *script* first touches CUDA, before its first allocation. memscope
never initialises CUDA itself (DESIGN.md section 5). The alternative, applying the cap at the
first sample that sees ``torch.cuda.is_initialized()``, would let everything allocated before
that sample (up to 1 / sample_hz seconds of the script's start, often the whole model) escape
the cap. An allocation above the cap raises the allocator's ordinary ``OutOfMemoryError``, which
the OOM recorder captures like any other.

:func:`parse_size` is imported by the CLI, so this module imports torch only inside functions.
"""

from __future__ import annotations

import re
import sys
from typing import Any

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of ``24GiB``, ``24GB`` (decimal), ``16G`` (a bare letter is binary, as in
    ``nvidia-smi`` and ``ls -h``), ``8000MiB`` or a plain byte count. ValueError if not a size
    above zero."""
    m = _SIZE.match(text or "")
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 24GiB, 24GB, 16G, 8000MiB)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"size must be above zero, not {text!r}")
    return value


def install(agent: Any, size: int) -> None:
    """Arrange the cap (see the module doc). Never raises into the training."""
    import torch

    if _no_cuda_device(torch):
        msg = ("--simulate-gpu applies only on CUDA: no CUDA device here, the run goes on "
               "without a memory cap")
        agent.event("warning", f"simulate_gpu: {msg}", {"simulate_gpu_bytes": size})
        print(f"memscope: {msg}", file=sys.stderr)
        return

    def apply() -> None:
        # Runs inside torch's lazy CUDA init: an exception here would fail the script's
        # first CUDA call, so every failure is only recorded.
        try:
            for index in range(torch.cuda.device_count()):
                total = int(torch.cuda.get_device_properties(index).total_memory)
                fraction = min(1.0, size / total)
                torch.cuda.set_per_process_memory_fraction(fraction, index)
                data = {"device": index, "simulate_gpu_bytes": size, "total_bytes": total,
                        "fraction": fraction}
                if size > total:
                    agent.event("warning", f"simulate_gpu: cuda:{index} has only {total} bytes, "
                                           f"less than the simulated {size}: no cap", data)
                else:
                    agent.event("simulate_gpu", f"cuda:{index} capped to {size} of {total} bytes "
                                                f"(fraction {fraction:.4f})", data)
        except Exception as exc:
            agent.event("collector_disabled", f"simulate_gpu: {type(exc).__name__}: {exc}")

    # Runs now when CUDA is already initialised, else queued for the script's first CUDA call.
    torch.cuda._lazy_call(apply)


def _no_cuda_device(torch: Any) -> bool:
    """Whether this process certainly has no CUDA device, asked without initialising the CUDA
    driver (``torch.cuda.is_available()`` may, and a driver initialised before a fork breaks
    CUDA in forked DataLoader workers): a CPU-only build, or NVML counting no device. When NVML
    cannot tell, the cap is queued; it then runs only if the script initialises CUDA."""
    if not torch.backends.cuda.is_built():
        return True
    try:
        return int(torch.cuda._device_count_nvml()) == 0
    except Exception:
        return False

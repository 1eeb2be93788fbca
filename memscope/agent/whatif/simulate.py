"""``--simulate-gpu SIZE``: run on a big GPU as if it had only SIZE of memory (issue #5).

The cap is ``torch.cuda.set_per_process_memory_fraction(SIZE / total, device)`` on every visible
device, handed to ``torch.cuda._lazy_call``: torch runs it inside its own lazy CUDA
initialisation, the moment the *script* first touches CUDA, before its first allocation. memscope
never initialises CUDA itself (DESIGN.md section 5). The alternative, applying the cap at the
first sample that sees ``torch.cuda.is_initialized()``, would let everything allocated before
that sample (up to 1 / sample_hz seconds of the script's start, often the whole model) escape
the cap. An allocation above the cap raises the allocator's ordinary ``OutOfMemoryError``, which
the OOM recorder captures like any other.

Sizes are parsed by :func:`memscope.units.parse_size` (the CLI's, without torch).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from memscope.agent.runtime.config import ENV_DB

def install(agent: Any, size: int) -> None:
    """Arrange the cap (see the module doc). Never raises into the training."""
    import torch

    if _no_cuda_device(torch):
        msg = ("--simulate-gpu applies only on CUDA: no CUDA device here, the run goes on "
               "without a memory cap")
        agent.event("warning", f"simulate_gpu: {msg}", {"simulate_gpu_bytes": size})
        if not os.environ.get(ENV_DB):
            # memscope.start(): say it now. Under attach nothing goes into the training's own
            # output: the supervisor prints this event's line after the run.
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

"""What one look at a process from outside measures: host RSS from /proc, GPU memory from NVML.

Host RSS is ``/proc/PID/statm``'s resident pages (one small read, no permission needed). GPU
memory is NVML's per-process reading (``nvmlDeviceGetComputeRunningProcesses`` and the graphics
list, what nvidia-smi and nvitop show), all processes of a device in one call, at most once per
``NVML_EVERY_S`` (NVML is slow and takes a driver lock). Where there is no reading the reason
is kept, once, for the GPU columns to say why they are empty.
"""

from __future__ import annotations

import os
import time
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")
NVML_EVERY_S = 1.0


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` in bytes; None when it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None


class GpuReadings:
    """Per-process device memory from NVML: ``read()`` -> {pid: {device index: bytes}}.

    ``why`` says why there are no readings (no driver, no GPU, NVML without per-process
    figures); None while they work."""

    def __init__(self, every_s: float = NVML_EVERY_S) -> None:
        self.every_s = every_s
        self.why: str | None = None
        self.devices = 0
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._last: dict[int, dict[int, int]] = {}
        self._at = -1e9
        self._started = False

    def _start(self) -> None:
        self._started = True
        try:
            import pynvml
        except ImportError:
            self.why = "no NVML bindings (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            name = type(exc).__name__
            if "LibraryNotFound" in name or "DriverNotLoaded" in name:
                self.why = "no NVIDIA driver on this machine: host figures only"
            else:
                self.why = f"NVML did not start ({' '.join(str(exc).split()) or name})"
            return
        self._nvml = pynvml
        try:
            self.devices = int(pynvml.nvmlDeviceGetCount())
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.devices)]
        except Exception as exc:  # noqa: BLE001
            self.why = f"NVML cannot list the GPUs ({' '.join(str(exc).split())})"
            return
        if not self.devices:
            self.why = "NVML sees no GPU on this machine: host figures only"

    def read(self) -> dict[int, dict[int, int]]:
        """{pid: {device index: bytes}} of every process NVML charges memory to."""
        if not self._started:
            self._start()
        if self._nvml is None or not self._handles:
            return {}
        now = time.monotonic()
        if now - self._at < self.every_s:
            return self._last
        self._at = now
        out: dict[int, dict[int, int]] = {}
        unknown = 0
        for index, handle in enumerate(self._handles):
            for lister in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    procs = getattr(self._nvml, lister)(handle)
                except Exception:  # noqa: BLE001 - one list not supported: the other may be
                    continue
                for p in procs:
                    used = getattr(p, "usedGpuMemory", None)
                    if not isinstance(used, int):
                        unknown += 1  # a container's pid namespace, a driver that does not say
                        continue
                    per = out.setdefault(int(p.pid), {})
                    per[index] = max(per.get(index, 0), used)
        if unknown and not out:
            self.why = "NVML does not report per-process memory here (a container, or the driver)"
        elif out:
            self.why = None
        self._last = out
        return out

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._nvml = None

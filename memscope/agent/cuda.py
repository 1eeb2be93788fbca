"""The narrow CUDA interface: allocator counters and NVML, nothing else touches the GPU.

Every function here is safe to call on a CPU-only build: it reports "no CUDA" instead of
initialising anything. CUDA is never initialised by memscope; it is only read once the user's
script has initialised it.
"""

from __future__ import annotations

from typing import Any, Mapping

# Keys of torch.cuda.memory_stats() that memscope keeps, and the column each lands in.
STAT_COLUMNS: dict[str, str] = {
    "allocated_bytes.all.current": "allocated",
    "allocated_bytes.all.peak": "allocated_peak",
    "reserved_bytes.all.current": "reserved",
    "reserved_bytes.all.peak": "reserved_peak",
    "active_bytes.all.current": "active",
    "active_bytes.all.peak": "active_peak",
    "inactive_split_bytes.all.current": "inactive_split",
    "num_alloc_retries": "alloc_retries",
    "num_ooms": "ooms",
}


def parse_memory_stats(stats: Mapping[str, Any]) -> dict[str, int | None]:
    """Pick memscope's columns out of a ``torch.cuda.memory_stats()`` dict (missing -> None)."""
    out: dict[str, int | None] = {}
    for key, column in STAT_COLUMNS.items():
        value = stats.get(key)
        out[column] = int(value) if value is not None else None
    return out


def cuda_devices_in_use() -> list[int]:
    """Indices of CUDA devices the process has allocated on; [] when CUDA is not initialised."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return []
    used = []
    for index in range(torch.cuda.device_count()):
        # A device the script never touched has no reserved memory; skip it rather than
        # asking for its stats (which is harmless, but noise in the timeline).
        stats = torch.cuda.memory_stats(index)
        if stats.get("reserved_bytes.all.peak", 0):
            used.append(index)
    return used


def read_device_stats(index: int) -> dict[str, int | None]:
    import torch

    # memory_stats reads host-side allocator counters under the allocator's mutex: it never
    # waits on the GPU, so it is safe from the sampler thread.
    return parse_memory_stats(torch.cuda.memory_stats(index))


class Nvml:
    """Device-level used/total memory through NVML, mapped to CUDA indices by UUID."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handles: dict[int, Any] = {}

    def _handle(self, cuda_index: int) -> Any:
        if cuda_index not in self._handles:
            import torch

            uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
            if not uuid.startswith("GPU-"):
                uuid = "GPU-" + uuid
            self._handles[cuda_index] = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
        return self._handles[cuda_index]

    def memory(self, cuda_index: int) -> tuple[int, int]:
        """(used, total) bytes of the whole device, all processes included."""
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle(cuda_index))
        return int(info.used), int(info.total)

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass

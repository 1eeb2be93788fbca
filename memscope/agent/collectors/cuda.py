"""The narrow CUDA interface: allocator counters and NVML, nothing else touches the GPU.

Every function here is safe to call on a CPU-only build: it reports "no CUDA" instead of
initialising anything. CUDA is never initialised by memscope; it is only read once the user's
script has initialised it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

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


def largest_free_block(segments: Iterable[Mapping[str, Any]] | None) -> int | None:
    """The largest inactive block in the allocator's segments (``torch.cuda.memory_snapshot()``
    entries: ``blocks`` with ``size`` and ``state``): the biggest request the cache can serve
    without a new ``cudaMalloc``. None when the segments were not read."""
    if segments is None:
        return None
    best = 0
    for seg in segments:
        for block in seg.get("blocks") or ():
            if block.get("state") == "inactive":
                size = block.get("size")
                if isinstance(size, int) and size > best:
                    best = size
    return best


def allocator_state(stats: Mapping[str, Any], segments: Iterable[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The allocator at an OOM, from a ``torch.cuda.memory_stats()`` dict and (optionally) the
    device's ``memory_snapshot()`` segments. ``cached_free_bytes`` is reserved but not allocated
    (what ``empty_cache`` could give back, if unsplit); ``inactive_split_bytes`` the part of it
    stranded in partly used segments (fragmentation)."""
    def get(key: str) -> int | None:
        v = stats.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    segs = list(segments) if segments is not None else None
    allocated = get("allocated_bytes.all.current")
    reserved = get("reserved_bytes.all.current")
    out: dict[str, Any] = {
        "allocated_bytes": allocated,
        "reserved_bytes": reserved,
        "active_bytes": get("active_bytes.all.current"),
        "inactive_split_bytes": get("inactive_split_bytes.all.current"),
        "cached_free_bytes": reserved - allocated if reserved is not None and allocated is not None else None,
        "largest_free_block_bytes": largest_free_block(segs),
        "alloc_retries": get("num_alloc_retries"),
        "ooms": get("num_ooms"),
        "segments": len(segs) if segs is not None else None,
    }
    if segs is not None and any(s.get("is_expandable") for s in segs):
        out["expandable_segments"] = True
    return out


def outside_pytorch(nvml_used: int | None, nvml_total: int | None, reserved: int | None,
                    process_used: int | None = None) -> dict[str, int | None]:
    """Device memory PyTorch's allocator does not hold: NVML's used bytes (all processes) minus
    this process's reserved bytes. With NVML's per-process figure, split into this process's
    own share (CUDA context, cuBLAS / cuDNN workspaces, NCCL buffers) and other processes'."""
    out: dict[str, int | None] = {"nvml_used_bytes": nvml_used, "nvml_total_bytes": nvml_total,
                                  "nvml_process_bytes": process_used, "outside_pytorch_bytes": None,
                                  "outside_this_process_bytes": None, "other_processes_bytes": None}
    if nvml_used is not None and reserved is not None:
        out["outside_pytorch_bytes"] = max(0, nvml_used - reserved)
    if process_used is not None and reserved is not None:
        out["outside_this_process_bytes"] = max(0, process_used - reserved)
        if nvml_used is not None:
            out["other_processes_bytes"] = max(0, nvml_used - process_used)
    return out


def expandable_segments(conf: str | None) -> bool:
    """Whether an allocator configuration string (``PYTORCH_CUDA_ALLOC_CONF``) turns
    ``expandable_segments`` on."""
    for part in (conf or "").split(","):
        key, _, value = part.partition(":")
        if key.strip() == "expandable_segments" and value.strip().lower() in ("true", "1"):
            return True
    return False


def cuda_devices_in_use() -> list[int]:
    """Indices of CUDA devices the process has allocated on; [] when CUDA is not initialised."""
    import torch

    # is_initialized() alone: is_available() asks the CUDA runtime for a device count, which
    # "poisons fork" (PyTorch's docs: CUDA then fails in the training's forked children) and fixes
    # the visible devices (a later CUDA_VISIBLE_DEVICES set by the script is ignored) in a process
    # that has not touched CUDA yet. Initialised implies available.
    if not torch.cuda.is_initialized():
        return []
    used = []
    for index in range(torch.cuda.device_count()):
        # A device the script never touched has no reserved memory; skip it rather than
        # asking for its stats (which is harmless, but noise in the timeline).
        stats = torch.cuda.memory_stats(index)
        if stats.get("reserved_bytes.all.peak", 0):
            used.append(index)
    return used


def device_limit(index: int, simulated: int = 0) -> int | None:
    """The bytes device ``index`` lets this process use: the ``--simulate-gpu`` cap, else its
    total memory (a property read: no allocation, CUDA already initialised by the script)."""
    import torch

    total = int(torch.cuda.get_device_properties(index).total_memory)
    return min(total, simulated) if simulated else total


def parse_nested_stats(raw: Mapping[str, Any]) -> dict[str, int | None]:
    """:func:`parse_memory_stats` of the allocator's nested dict (``torch._C._cuda_memoryStats``:
    ``raw["allocated_bytes"]["all"]["current"]`` for ``allocated_bytes.all.current``)."""
    out: dict[str, int | None] = {}
    for key, column in STAT_COLUMNS.items():
        value: Any = raw
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        out[column] = int(value) if value is not None else None
    return out


def _raw_stats(index: int) -> Mapping[str, Any] | None:
    """The allocator's nested counters, read directly. ``torch.cuda.memory_stats`` flattens and
    sorts every counter and asks the driver for the device count on the way: about 0.2 ms of
    the GIL per call measured on an H100 machine (the counters themselves: 30 µs), several
    times a step."""
    import torch

    read = getattr(torch._C, "_cuda_memoryStats", None)
    if read is None or not torch.cuda.is_initialized():
        return None
    raw = read(index)
    return raw if isinstance(raw, Mapping) else None


def read_device_stats(index: int) -> dict[str, int | None]:
    import torch

    # reads host-side allocator counters under the allocator's mutex: it never waits on the
    # GPU, so it is safe from the sampler thread.
    try:
        raw = _raw_stats(index)
    except Exception:  # a torch whose private reader differs: the public one
        raw = None
    if raw is not None:
        return parse_nested_stats(raw)
    return parse_memory_stats(torch.cuda.memory_stats(index))


def allocated_and_peak() -> tuple[int, int]:
    """(allocated, allocated peak) bytes of the current device, in one read of the counters."""
    import torch

    try:
        raw = _raw_stats(torch.cuda.current_device())
        if raw is not None:
            row = raw["allocated_bytes"]["all"]
            return int(row["current"]), int(row["peak"])
    except Exception:
        pass
    return int(torch.cuda.memory_allocated()), int(torch.cuda.max_memory_allocated())


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

    def process_used(self, cuda_index: int, pid: int) -> int | None:
        """Bytes NVML charges to process ``pid`` on the device (None where it cannot tell: a
        container's pid namespace, or a driver that does not report it)."""
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle(cuda_index))
        except Exception:
            return None
        for p in procs:
            if int(getattr(p, "pid", -1)) == pid:
                used = getattr(p, "usedGpuMemory", None)
                return int(used) if isinstance(used, int) else None
        return None

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass

"""Write ``cuda_state_built.json``: what the agent reads from the CUDA allocator and NVML at an
out-of-memory error, BUILT BY HAND to the documented formats (not captured on a GPU):

* ``memory_stats``: a ``torch.cuda.memory_stats()`` dict (the key names of its docstring:
  ``allocated_bytes.all.current``, ``reserved_bytes.all.current``, ``inactive_split_bytes.all.current``,
  ``num_alloc_retries``, ``num_ooms``, ...), consistent with the segments below;
* ``segments``: ``torch.cuda.memory_snapshot()`` entries (``_snapshot()``'s Segment/Block
  structure: address, total_size, allocated_size, active_size, stream, segment_type, blocks with
  size, requested_size, address, state);
* ``mem_get_info``: ``torch.cuda.mem_get_info()`` (free, total);
* ``observer``: the allocator's OOM observer arguments (device, requested bytes, the memory the
  process may use, the driver's free bytes);
* ``nvml``: ``nvmlDeviceGetMemoryInfo().used/.total`` and this process's ``usedGpuMemory`` from
  ``nvmlDeviceGetComputeRunningProcesses``;
* ``message``: the text of the ``torch.OutOfMemoryError`` (torch 2.x wording).

The story: an 80 GB GPU, 60 GiB reserved in three large segments, each with an inactive block
(640, 512 and 512 MiB) beside its allocated blocks: 1.63 GiB free in the cache, none of it in a
block of the 1 GiB asked for (fragmentation); 312 MiB free on the device; outside PyTorch, this
process's CUDA context (536 MiB) and another process (120 MiB).

    python tests/data/make_cuda_state.py        # rewrites the file next to this script
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GiB, MiB = 2 ** 30, 2 ** 20
TOTAL = 85_032_419_328  # an 80 GB card's total_memory
BASE = 0x7F00_0000_0000


def segment(index: int, inactive: int) -> dict[str, Any]:
    address = BASE + index * 20 * GiB
    used = 20 * GiB - inactive
    half = used // 2
    blocks = [
        {"address": address, "size": half, "requested_size": half, "state": "active_allocated"},
        {"address": address + half, "size": inactive, "requested_size": 0, "state": "inactive"},
        {"address": address + half + inactive, "size": used - half, "requested_size": used - half,
         "state": "active_allocated"},
    ]
    return {"device": 0, "address": address, "total_size": 20 * GiB, "allocated_size": used,
            "active_size": used, "requested_size": used, "stream": 0, "segment_type": "large",
            "segment_pool_id": [0, 0], "is_expandable": False, "blocks": blocks}


def state() -> dict[str, Any]:
    segments = [segment(0, 640 * MiB), segment(1, 512 * MiB), segment(2, 512 * MiB)]
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(s["allocated_size"] for s in segments)
    split = reserved - allocated
    stats = {
        "allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": allocated + GiB // 2,
        "allocated_bytes.all.allocated": 7 * allocated, "allocated_bytes.all.freed": 6 * allocated,
        "reserved_bytes.all.current": reserved, "reserved_bytes.all.peak": reserved,
        "active_bytes.all.current": allocated, "active_bytes.all.peak": allocated + GiB // 2,
        "inactive_split_bytes.all.current": split, "inactive_split_bytes.all.peak": split,
        "inactive_split.all.current": 3, "allocation.all.current": 6, "segment.all.current": 3,
        "num_alloc_retries": 2, "num_ooms": 1, "num_device_alloc": 3, "num_device_free": 0,
        "max_split_size": -1, "oversize_allocations.current": 0, "oversize_segments.current": 0,
    }
    device_free = 312 * MiB
    context = 536 * MiB
    other_process = 120 * MiB
    return {
        "memory_stats": stats,
        "segments": segments,
        "mem_get_info": [device_free, TOTAL],
        "observer": {"device": 0, "requested_bytes": GiB, "device_limit": TOTAL, "device_free": device_free},
        "nvml": {"used": reserved + context + other_process, "total": TOTAL, "process_used": reserved + context},
        "message": ("CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
                    "of which 312.00 MiB is free. Including non-PyTorch memory, this process has 60.52 GiB "
                    "memory in use. Of the allocated memory 58.37 GiB is allocated by PyTorch, and 1.63 GiB "
                    "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
                    "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."),
    }


def dumps() -> str:
    return json.dumps(state(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("cuda_state_built.json")
    out.write_text(dumps())
    print(out)

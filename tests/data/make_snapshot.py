"""Write ``cuda_snapshot_built.pickle``: a CUDA memory snapshot BUILT BY HAND to the documented
format of ``torch.cuda.memory._snapshot()`` / ``_dump_snapshot()`` (torch 2.x docstring: segments
with blocks and frames, ``device_traces`` with trace entries, an ``oom`` entry with
``device_free`` and no ``addr``). It was not captured on a GPU. Deterministic: the same bytes on
every run (no torch needed).

    python tests/data/make_snapshot.py            # rewrites the file next to this script
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

GiB, MiB = 2 ** 30, 2 ** 20
BASE = 0x7F00_0000_0000  # segment A's device address
SMALL = 0x7F10_0000_0000  # segment B's


def frames(line: int, name: str = "train_step") -> list[dict[str, Any]]:
    """Innermost first, as the allocator records them: torch's frames, then the script's."""
    return [{"filename": "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
             "line": 125, "name": "forward"},
            {"filename": "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py",
             "line": 1750, "name": "_call_impl"},
            {"filename": "/home/user/train.py", "line": line, "name": name}]


def snapshot() -> dict[str, Any]:
    seg_a = {
        "device": 0, "address": BASE, "total_size": 2 * GiB, "allocated_size": GiB + 512 * MiB,
        "active_size": GiB + 512 * MiB, "requested_size": GiB + 512 * MiB, "stream": 0,
        "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
        "frames": frames(40),
        "blocks": [
            {"address": BASE, "size": GiB, "requested_size": GiB, "state": "active_allocated",
             "frames": frames(40)},
            {"address": BASE + GiB, "size": 512 * MiB, "requested_size": 512 * MiB,
             "state": "active_allocated", "frames": frames(41)},
            {"address": BASE + GiB + 512 * MiB, "size": 512 * MiB, "requested_size": 0,
             "state": "inactive", "frames": []},
        ],
    }
    seg_b = {
        "device": 0, "address": SMALL, "total_size": 2 * MiB, "allocated_size": 512,
        "active_size": 512, "requested_size": 500, "stream": 0, "segment_type": "small",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames(38, "make_batch"),
        "blocks": [
            {"address": SMALL, "size": 512, "requested_size": 500, "state": "active_allocated",
             "frames": frames(38, "make_batch")},
            {"address": SMALL + 512, "size": 2 * MiB - 512, "requested_size": 0,
             "state": "inactive", "frames": []},
        ],
    }
    trace = [
        {"action": "segment_alloc", "addr": SMALL, "size": 2 * MiB, "stream": 0, "time_us": 1000,
         "frames": frames(38, "make_batch")},
        {"action": "alloc", "addr": SMALL, "size": 512, "stream": 0, "time_us": 1001,
         "frames": frames(38, "make_batch")},
        {"action": "segment_alloc", "addr": BASE, "size": 2 * GiB, "stream": 0, "time_us": 1010,
         "frames": frames(40)},
        {"action": "alloc", "addr": BASE, "size": GiB, "stream": 0, "time_us": 1011,
         "frames": frames(40)},
        {"action": "alloc", "addr": BASE + GiB, "size": 512 * MiB, "stream": 0, "time_us": 1020,
         "frames": frames(41)},
        {"action": "alloc", "addr": BASE + GiB + 512 * MiB, "size": 512 * MiB, "stream": 0,
         "time_us": 1030, "frames": frames(42)},
        {"action": "free_requested", "addr": BASE + GiB + 512 * MiB, "size": 512 * MiB,
         "stream": 0, "time_us": 1040, "frames": frames(43)},
        {"action": "free_completed", "addr": BASE + GiB + 512 * MiB, "size": 512 * MiB,
         "stream": 0, "time_us": 1041, "frames": frames(43)},
        # the failure: 1 GiB + 2 MiB asked for, 300 MiB free on the device (no addr for oom)
        {"action": "oom", "size": GiB + 2 * MiB, "stream": 0, "time_us": 1050,
         "device_free": 300 * MiB, "frames": frames(44)},
    ]
    return {"segments": [seg_a, seg_b], "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                   "garbage_collection_threshold": 0.0,
                                   "expandable_segments": False}}


def dumps() -> bytes:
    return pickle.dumps(snapshot(), protocol=4)


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("cuda_snapshot_built.pickle")
    out.write_bytes(dumps())
    print(out)

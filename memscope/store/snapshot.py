"""Import a CUDA memory snapshot (``torch.cuda.memory._dump_snapshot``) into a new run file.

The pickle is read with a restricted unpickler that refuses every global: a snapshot is plain
dicts, lists, strings, numbers, booleans and None, so anything that asks to import or call
something is not a snapshot and is refused before it can run. No torch import is needed.

What lands in the run file (no schema change: the ``events`` table):
* ``snapshot_segment``: one per allocator segment (device, address, reserved and allocated
  bytes, block count, the segment's first stack frame);
* ``snapshot_trace``: one per device trace (entry counts by action);
* ``oom``: one per trace entry of action ``oom`` (requested = its size, ``device_free`` from the
  entry, allocated = the device's allocated bytes in the snapshot's segments, fragmentation:
  inactive bytes in partly used segments and the largest inactive block).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sqlite3
import time
from typing import Any

from memscope.store.runs import create_run, finish_run, prepare_path, register_process
from memscope.store.schema import RunFileError
from memscope.store.writer import connect_rw

MAX_SNAPSHOT_BYTES = 4 * 1024 ** 3


class _PlainUnpickler(pickle.Unpickler):
    """Plain containers and scalars only: every import is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses to load {module}.{name}: a memory snapshot holds "
                                     "only plain data, this pickle wants to import or call code")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refuses persistent references: not a plain memory snapshot")


def load_snapshot(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
    except OSError as exc:
        raise RunFileError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise RunFileError(f"{path}: larger than {MAX_SNAPSHOT_BYTES} bytes; not imported")
    try:
        snap = _PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise RunFileError(f"{path}: unsafe or invalid pickle, not imported ({exc})") from None
    except Exception as exc:  # truncated, not a pickle at all, too deep
        raise RunFileError(f"{path}: not a readable pickle ({type(exc).__name__})") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list):
        raise RunFileError(f"{path}: not a CUDA memory snapshot (no 'segments' list)")
    return snap


def _site(frames: Any) -> str | None:
    """The first frame outside torch's own files, as file:line (name)."""
    if not isinstance(frames, list):
        return None
    for fr in frames:
        if isinstance(fr, dict):
            fn = str(fr.get("filename", ""))
            if fn and "/torch/" not in fn and not fn.startswith("??"):
                return f"{fn}:{fr.get('line')} ({fr.get('name')})"
    return None


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def import_snapshot(snapshot_path: str, db: str, force: bool = False) -> dict[str, int]:
    """Write ``snapshot_path`` into a new run file ``db``; return counts of what was stored."""
    snap = load_snapshot(snapshot_path)
    prepare_path(db, force)
    now = time.time()
    create_run(db, ["import", snapshot_path], started=now)
    segments = [s for s in snap["segments"] if isinstance(s, dict)]
    devices = sorted({_int(s.get("device")) or 0 for s in segments})
    traces = snap.get("device_traces") if isinstance(snap.get("device_traces"), list) else []
    device = "cpu" if not segments and not traces else (
        f"cuda:{devices[0]}" if len(devices) == 1 else "cuda")
    proc = register_process(db, {"pid": 0, "argv": json.dumps(["import", snapshot_path]),
                                 "device": device, "options": json.dumps({"imported": snapshot_path}),
                                 "started": now, "ended": now, "status": "stopped"})
    allocated: dict[int, int] = {}
    reserved: dict[int, int] = {}
    # fragmentation: inactive blocks inside segments that are partly in use (the allocator cannot
    # give them back), and the largest inactive block (the biggest request that fits unsplit)
    split: dict[int, int] = {}
    largest_free: dict[int, int] = {}
    rows: list[tuple[Any, ...]] = []
    for s in segments:
        dev = _int(s.get("device")) or 0
        blocks = [b for b in s.get("blocks") or [] if isinstance(b, dict)]
        alloc = _int(s.get("allocated_size"))
        if alloc is None:
            alloc = sum(_int(b.get("size")) or 0 for b in blocks if b.get("state") == "active_allocated")
        total = _int(s.get("total_size")) or 0
        allocated[dev] = allocated.get(dev, 0) + alloc
        reserved[dev] = reserved.get(dev, 0) + total
        inactive = [_int(b.get("size")) or 0 for b in blocks if b.get("state") == "inactive"]
        if inactive and len(inactive) < len(blocks):
            split[dev] = split.get(dev, 0) + sum(inactive)
        largest_free[dev] = max([largest_free.get(dev, 0)] + inactive)
        frames = s.get("frames") or next((b.get("frames") for b in blocks if b.get("frames")), None)
        data = {"device": dev, "address": _int(s.get("address")), "total_size": total,
                "allocated_size": alloc, "active_size": _int(s.get("active_size")),
                "stream": _int(s.get("stream")), "segment_type": s.get("segment_type"),
                "blocks": len(blocks), "site": _site(frames)}
        rows.append((proc, now, None, "snapshot_segment",
                     f"segment on cuda:{dev}: {total} bytes reserved, {alloc} allocated", json.dumps(data)))
    ooms = 0
    for dev, trace in enumerate(traces):
        if not isinstance(trace, list):
            continue
        counts: dict[str, int] = {}
        for entry in trace:
            if not isinstance(entry, dict):
                continue
            action = str(entry.get("action"))
            counts[action] = counts.get(action, 0) + 1
            if action != "oom":
                continue
            ooms += 1
            size = _int(entry.get("size"))
            site = _site(entry.get("frames"))
            message = (f"CUDA out of memory on device {dev}: tried to allocate {size} bytes"
                       " (from a memory snapshot)")
            data = {"step": None, "phase": "other", "where": "snapshot", "module": None,
                    "module_stack": [], "message": message, "requested_bytes": size,
                    "requested_exact": True, "device": f"cuda:{dev}",
                    "live_bytes": allocated.get(dev), "reserved_bytes": reserved.get(dev),
                    "device_free_bytes": _int(entry.get("device_free")), "site": site,
                    "inactive_split_bytes": split.get(dev, 0),
                    "largest_free_block_bytes": largest_free.get(dev, 0),
                    "stream": _int(entry.get("stream")), "time_us": _int(entry.get("time_us"))}
            rows.append((proc, now, None, "oom", message, json.dumps(data)))
        rows.append((proc, now, None, "snapshot_trace", f"device {dev} trace: {len(trace)} entries",
                     json.dumps({"device": dev, "entries": len(trace), "actions": counts})))
    conn = connect_rw(db)
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO events (proc, t, step, kind, message, data)"
                             " VALUES (?, ?, ?, ?, ?, ?)", rows)
    except sqlite3.Error as exc:
        raise RunFileError(f"{db}: cannot write ({exc})") from None
    finally:
        conn.close()
    finish_run(db, exit_code=None, signal=None, ended=now, status="imported")
    return {"segments": len(segments), "ooms": ooms,
            "devices": len(devices), "bytes": os.path.getsize(snapshot_path)}

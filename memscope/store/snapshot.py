"""Import a CUDA memory snapshot (``torch.cuda.memory._dump_snapshot``) into a new run file.

Reading, checking and aggregating is :mod:`memscope.store.snapshot_data`. What lands in the run
file (no schema change: the ``events`` table, a few rows whatever the snapshot's size):

* ``snapshot_device``: per device, the segment count, reserved / allocated / active bytes,
  inactive bytes in split segments, the largest free block, a histogram of segment sizes, and the
  allocated bytes by allocation site (largest first);
* ``snapshot_site``: per device, allocation site and segment type: segments, reserved, allocated
  (the largest ``TOP_SITES``, the rest in one row);
* ``snapshot_segment``: the ``TOP_SEGMENTS`` largest segments, one by one;
* ``snapshot_trace``: per device trace, entry counts by action;
* ``oom``: per trace entry of action ``oom`` (requested = its size, ``device_free`` from the
  entry, and the device's allocator state from the segments: allocated, reserved, free in the
  cache, the largest free block, inactive split bytes, expandable segments);
* ``snapshot``: the totals and the allocator settings.

The run file appears only when the import succeeds: it is written under a new temporary name
beside the target (random, created exclusively, 0600 or 0640) and renamed at the end, only over
a regular file or nothing (an existing file is replaced only then, with ``--force``).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import stat
import time
from typing import Any, Callable

from memscope.safe_files import put_in_place
from memscope.store.runs import FileId, create_run, discard_run, finish_run, register_process
from memscope.store.schema import RunFileError
from memscope.store.snapshot_data import (MAX_SNAPSHOT_BYTES, TOP_SITES, SnapshotError, Summary,
                                          load_snapshot, summarize)
from memscope.store.writer import connect_rw
from memscope.units import human_bytes

__all__ = ["MAX_SNAPSHOT_BYTES", "SnapshotError", "import_snapshot", "load_snapshot"]
TOP_ALLOCATED_SITES = 20  # allocated-by-site entries kept per device


def check_target(db: str, force: bool) -> None:
    """Whether ``db`` may be written (nothing is removed here: see import_snapshot)."""
    if os.path.islink(db):
        raise RunFileError(f"{db}: is a symbolic link (to {os.readlink(db)}); give the file's own path")
    if os.path.isdir(db):
        raise RunFileError(f"{db}: is a directory; give a file name with --db")
    if os.path.lexists(db) and not force:
        raise RunFileError(f"{db}: already exists; pass --force to overwrite it")
    if os.path.lexists(db) and not stat.S_ISREG(os.lstat(db).st_mode):
        raise RunFileError(f"{db}: exists and is not a regular file; refusing to replace it")
    parent = os.path.dirname(os.path.abspath(db))
    if not os.path.isdir(parent):
        raise RunFileError(f"{db}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunFileError(f"{db}: directory {parent} is not writable")


def import_snapshot(snapshot_path: str, db: str, force: bool = False,
                    group_readable: bool = False,
                    progress: Callable[[str], None] | None = None) -> dict[str, int]:
    """Write ``snapshot_path`` into a new run file ``db`` (0600, 0640 with ``group_readable``);
    return counts of what was read. ``progress`` is told which part is under way."""
    say = progress or (lambda _text: None)
    check_target(db, force)
    say(f"reading {snapshot_path}")
    snap = load_snapshot(snapshot_path)
    try:
        say("summarising the segments and traces")
        summary = summarize(snap)
    except SnapshotError as exc:
        raise SnapshotError(f"{snapshot_path}: {exc}") from None
    except RecursionError:
        raise SnapshotError(f"{snapshot_path}: nested too deeply to be a snapshot; not imported") from None
    del snap
    tmp = f"{db}.importing-{secrets.token_hex(8)}"
    created: FileId | None = None
    try:
        now = time.time()
        created = create_run(tmp, ["import", snapshot_path], started=now, group_readable=group_readable)
        say(f"writing {db}")
        _write(tmp, snapshot_path, summary, now)
        _remove_sidecars(db)
        put_in_place(tmp, db, "import: --db")
    except BaseException:
        discard_run(tmp, created)  # the half-written file and its WAL / journal
        raise
    return {"segments": summary.segments, "ooms": len(summary.ooms) + summary.ooms_dropped,
            "devices": len(summary.devices), "bytes": os.path.getsize(snapshot_path)}


def _remove_sidecars(db: str) -> None:
    """The old file's WAL / journal, which would otherwise be applied to the new file."""
    for suffix in ("-wal", "-shm", "-journal"):
        try:
            os.remove(db + suffix)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RunFileError(f"{db}: cannot overwrite ({exc.strerror})") from None


def _write(path: str, snapshot_path: str, s: Summary, now: float) -> None:
    devices = sorted(s.devices)
    device = "cpu" if not devices and not s.traces else (
        f"cuda:{devices[0]}" if len(devices) == 1 else "cuda")
    proc = register_process(path, {"pid": 0, "argv": ["import", snapshot_path],
                                   "device": device, "options": json.dumps({"imported": snapshot_path}),
                                   "started": now, "ended": now, "status": "stopped"})
    rows: list[tuple[Any, ...]] = []

    def event(kind: str, message: str, data: dict[str, Any]) -> None:
        rows.append((proc, now, None, kind, message, json.dumps(data)))

    conf = str(s.settings.get("PYTORCH_CUDA_ALLOC_CONF") or "")
    expandable_setting = s.settings.get("expandable_segments") is True
    state: dict[int, dict[str, Any]] = {}
    for dev in devices:
        t = s.devices[dev]
        by_site = sorted(t.allocated_sites.items(), key=lambda kv: (-kv[1], kv[0] or ""))
        state[dev] = {"allocated_bytes": t.allocated, "reserved_bytes": t.reserved, "active_bytes": t.active,
                      "cached_free_bytes": t.reserved - t.allocated, "inactive_split_bytes": t.inactive_split,
                      "largest_free_block_bytes": t.largest_free_block, "segments": t.segments,
                      "expandable_segments": bool(t.expandable) or expandable_setting}
        event("snapshot_device", f"cuda:{dev}: {t.segments} segment(s), {t.reserved} bytes reserved, "
                                 f"{t.allocated} allocated",
              {"device": dev, **state[dev], "blocks": t.blocks,
               "size_histogram": {str(1 << (b - 1) if b else 0): n for b, n in sorted(t.sizes.items())},
               "allocated_by_site": [{"site": k, "bytes": v} for k, v in by_site[:TOP_ALLOCATED_SITES]],
               "allocated_sites": len(by_site)})
        groups = sorted(t.sites.items(), key=lambda kv: -kv[1][1])
        for (site, kind), (n, reserved, allocated) in groups[:TOP_SITES]:
            event("snapshot_site", f"cuda:{dev}: {n} segment(s) from {site or 'unknown site'}",
                  {"device": dev, "site": site, "segment_type": kind, "segments": n,
                   "reserved": reserved, "allocated": allocated})
        rest = groups[TOP_SITES:]
        if rest:
            event("snapshot_site", f"cuda:{dev}: {len(rest)} more site(s)",
                  {"device": dev, "site": None, "segment_type": None, "other_sites": len(rest),
                   "segments": sum(g[1][0] for g in rest), "reserved": sum(g[1][1] for g in rest),
                   "allocated": sum(g[1][2] for g in rest)})
    for total, _order, row in sorted(s.largest, key=lambda x: (-x[0], x[1])):
        event("snapshot_segment", f"segment on cuda:{row['device']}: {total} bytes reserved, "
                                  f"{row['allocated_size']} allocated", row)
    for tr in s.traces:
        event("snapshot_trace", f"device {tr['device']} trace: {tr['entries']} entries", tr)
    for o in s.ooms:
        dev = o["device"]
        size = o["size"]
        message = (f"CUDA out of memory on device {dev}: tried to allocate {human_bytes(size)}"
                   " (from a memory snapshot)")
        dev_state = state.get(dev, {})
        top = s.devices[dev].allocated_sites if dev in s.devices else {}
        by_site = sorted(top.items(), key=lambda kv: (-kv[1], kv[0] or ""))[:10]
        event("oom", message, {
            "step": None, "phase": "other", "where": "snapshot", "module": None, "module_stack": [],
            "message": message, "requested_bytes": size, "requested_exact": True, "device": f"cuda:{dev}",
            "live_bytes": dev_state.get("allocated_bytes"), **dev_state,
            "device_free_bytes": o["device_free"], "site": o["site"], "stream": o["stream"],
            "time_us": o["time_us"], "alloc_conf": conf,
            "allocated_by_site": [{"site": k, "bytes": v} for k, v in by_site]})
    event("snapshot", f"imported {snapshot_path}: {s.segments} segment(s) on {len(devices)} device(s)",
          {"path": snapshot_path, "segments": s.segments, "devices": devices,
           "ooms": len(s.ooms) + s.ooms_dropped, "ooms_not_stored": s.ooms_dropped,
           "allocator_settings": s.settings})
    conn = connect_rw(path)
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO events (proc, t, step, kind, message, data)"
                             " VALUES (?, ?, ?, ?, ?, ?)", rows)
    except sqlite3.Error as exc:
        raise RunFileError(f"{path}: cannot write ({exc})") from None
    finally:
        conn.close()
    finish_run(path, exit_code=None, signal=None, ended=now, status="imported")

"""Read a CUDA memory snapshot (``torch.cuda.memory._dump_snapshot``) safely, check it, and
aggregate it into the few numbers memscope stores.

Safety: the pickle is read with a restricted unpickler that refuses every global (a snapshot is
plain dicts, lists, strings, numbers, booleans and None): anything that asks to import or call
something is refused before it can run, and no torch import is needed.

Scale: the work is proportional to the pickle's size, whatever its shape. Every container is
summarised once, by identity (a pickle can reference one object many times: 3 million copies of
one segment cost 2 bytes each in the file, and a "memo bomb" nests such references so that a
naive walk visits billions of leaves); a further reference adds the cached summary again.
Nothing is kept per segment: the aggregates are per device, per allocation site, a size
histogram, and the largest segments.

Checks: the fields memscope reads must have their documented types (sizes and addresses are
non-negative integers, names are strings, lists are lists); anything else is refused with one
line naming the place (``segments[12]['total_size'] is inf, not a byte count``). Keys memscope
does not read are ignored, whatever they hold.
"""

from __future__ import annotations

import math
import pickle
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from memscope.store.schema import RunFileError

MAX_SNAPSHOT_BYTES = 4 * 1024 ** 3
MAX_BYTES = 1 << 63  # sizes and addresses fit SQLite's integers
MAX_DEVICES = 1024  # device indices and device traces: a machine has a few GPUs, not thousands
MAX_VISITS = 100_000_000  # container references walked: past this the file is refused, not hung on
TOP_SEGMENTS = 100  # the largest segments, stored one by one
TOP_SITES = 2000  # allocation sites stored per device (the rest summed into one row)
MAX_OOMS = 1000  # oom trace entries stored as events (the rest counted)
_SEGMENT_INTS = ("device", "total_size", "allocated_size", "active_size", "requested_size", "address", "stream")


class SnapshotError(RunFileError):
    """A snapshot that is unsafe, unreadable or not in the documented format. The message is one
    line, whatever the file put in it (names from a pickle can hold newlines)."""

    def __init__(self, message: str) -> None:
        text = " ".join(message.split())
        super().__init__(text if len(text) <= 400 else text[:397] + "...")


class _PlainUnpickler(pickle.Unpickler):
    """Plain containers and scalars only: every import is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses to load {module}.{name}: a memory snapshot holds "
                                     "only plain data, this pickle wants to import or call code")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refuses persistent references: not a plain memory snapshot")


def load_snapshot(path: str) -> dict[str, Any]:
    """Unpickle ``path`` with the restricted unpickler; SnapshotError with one line on failure."""
    import os

    try:
        size = os.path.getsize(path)
        if size > MAX_SNAPSHOT_BYTES:
            raise SnapshotError(f"{path}: larger than {MAX_SNAPSHOT_BYTES} bytes; not imported")
        with open(path, "rb") as f:
            snap = _PlainUnpickler(f).load()
    except SnapshotError:
        raise
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read ({exc.strerror})") from None
    except pickle.UnpicklingError as exc:
        raise SnapshotError(f"{path}: unsafe or invalid pickle, not imported ({exc})") from None
    except MemoryError:
        raise SnapshotError(f"{path}: the pickle asks for more memory than there is; not imported") from None
    except Exception as exc:  # truncated, not a pickle at all, an int too long, ...
        raise SnapshotError(f"{path}: not a readable pickle ({type(exc).__name__})") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list):
        raise SnapshotError(f"{path}: not a CUDA memory snapshot (no 'segments' list)")
    return snap


# -- checked reads ------------------------------------------------------------------------------

def _bad(where: str, what: str, value: Any) -> SnapshotError:
    shown = repr(value) if isinstance(value, (int, float, str, bytes, bool)) or value is None \
        else f"a {type(value).__name__}"
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return SnapshotError(f"not a CUDA memory snapshot: {where} is {shown}, not {what}")


def _size(d: dict[Any, Any], key: str, where: str, required: bool = False) -> int | None:
    v = d.get(key)
    if v is None:
        if required:
            raise SnapshotError(f"not a CUDA memory snapshot: {where} has no '{key}'")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(f"{where}['{key}']", "a byte count", v)
    if isinstance(v, float):
        if not math.isfinite(v) or v != int(v):
            raise _bad(f"{where}['{key}']", "a byte count", v)
        v = int(v)
    if not 0 <= v < MAX_BYTES:
        raise _bad(f"{where}['{key}']", "a byte count", v)
    return v


def _text(d: dict[Any, Any], key: str, where: str) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise _bad(f"{where}['{key}']", "a string", v)
    return v


def _list(d: dict[Any, Any], key: str, where: str) -> list[Any]:
    v = d.get(key)
    if v is None:
        return []
    if not isinstance(v, (list, tuple)):
        raise _bad(f"{where}['{key}']", "a list", v)
    return v  # type: ignore[return-value]


def _dict(v: Any, where: str) -> dict[Any, Any]:
    if not isinstance(v, dict):
        raise _bad(where, "a dict", v)
    return v


# -- the aggregates -----------------------------------------------------------------------------

@dataclass
class DeviceTotals:
    segments: int = 0
    reserved: int = 0
    allocated: int = 0
    active: int = 0
    blocks: int = 0
    inactive_split: int = 0  # inactive blocks inside partly used segments: fragmentation
    largest_free_block: int = 0
    expandable: int = 0
    sizes: dict[int, int] = field(default_factory=dict)  # log2 bucket of segment size -> count
    sites: dict[tuple[str | None, str | None], list[int]] = field(default_factory=dict)
    allocated_sites: dict[str | None, int] = field(default_factory=dict)  # active blocks by site


@dataclass
class Summary:
    devices: dict[int, DeviceTotals] = field(default_factory=dict)
    segments: int = 0
    largest: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)  # (size, order, row)
    traces: list[dict[str, Any]] = field(default_factory=list)  # per device: entries, actions
    ooms: list[dict[str, Any]] = field(default_factory=list)
    ooms_dropped: int = 0
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Seg:
    """One segment object's contribution (cached by identity)."""

    device: int
    total: int
    allocated: int
    active: int | None
    blocks: int
    inactive: int
    largest_inactive: int
    split: bool
    expandable: bool
    site: str | None
    kind: str | None
    row: dict[str, Any]
    active_by_site: dict[str | None, int]


class _Walker:
    def __init__(self) -> None:
        self.visits = 0
        self.sites: dict[int, str | None] = {}  # id(frames list) -> site
        self.segs: dict[int, _Seg] = {}
        self.blocks: dict[int, tuple[int, int, int, int, dict[str | None, int], Any]] = {}

    def visit(self, n: int = 1) -> None:
        self.visits += n
        if self.visits > MAX_VISITS:
            raise SnapshotError(f"not imported: more than {MAX_VISITS:,} references to walk "
                                "(a pickle built to expand, not a snapshot)")

    # The walk's hot paths check the common case inline (an int in range, a str, a dict) and
    # build the place's name for a message only when a check fails.

    def site(self, frames: Any, where: str) -> str | None:
        """The first frame outside torch's own files, as file:line (name)."""
        if frames is None:
            return None
        key = id(frames)
        if key in self.sites:
            return self.sites[key]
        if type(frames) is not list and type(frames) is not tuple:
            raise _bad(where, "a list of frames", frames)
        found = None
        self.visit(len(frames))
        for i, fr in enumerate(frames):
            if type(fr) is not dict:
                raise _bad(f"{where}[{i}]", "a dict", fr)
            fn, line, name = fr.get("filename"), fr.get("line"), fr.get("name")
            if fn is not None and type(fn) is not str:
                raise _bad(f"{where}[{i}]['filename']", "a string", fn)
            if line is not None and type(line) is not int:
                raise _bad(f"{where}[{i}]['line']", "a line number", line)
            if name is not None and type(name) is not str:
                raise _bad(f"{where}[{i}]['name']", "a string", name)
            if fn and "/torch/" not in fn and not fn.startswith("??"):
                found = f"{fn}:{line} ({name})"
                break
        self.sites[key] = found
        return found

    def block_list(self, blocks: Sequence[Any], where: str) -> tuple[int, int, int, int, dict[str | None, int], Any]:
        """(blocks, allocated bytes of active blocks, inactive bytes, largest inactive, active
        bytes by site, the first block's frames) of one blocks list, once per list object."""
        key = id(blocks)
        got = self.blocks.get(key)
        if got is not None:
            return got
        alloc = inactive = largest = 0
        by_site: dict[str | None, int] = {}
        first_frames = None
        self.visit(len(blocks))
        for i, b in enumerate(blocks):
            if type(b) is not dict:
                raise _bad(f"{where}[{i}]", "a dict", b)
            size = b.get("size")
            if type(size) is not int or not 0 <= size < MAX_BYTES:
                size = _size(b, "size", f"{where}[{i}]", required=True) or 0
            state = b.get("state")
            if state is not None and type(state) is not str:
                raise _bad(f"{where}[{i}]['state']", "a string", state)
            frames = b.get("frames")
            if first_frames is None and frames:
                first_frames = frames
            if state == "active_allocated":
                alloc += size
                site = self.site(frames, f"{where}[{i}]['frames']") if frames else None
                by_site[site] = by_site.get(site, 0) + size
            elif state == "inactive":
                inactive += size
                if size > largest:
                    largest = size
        got = (len(blocks), alloc, inactive, largest, by_site, first_frames)
        self.blocks[key] = got
        return got

    def segment(self, s: Any, where: str) -> _Seg:
        key = id(s)
        got = self.segs.get(key)
        if got is not None:
            return got
        if type(s) is not dict:
            raise _bad(where, "a dict", s)
        sizes: dict[str, int | None] = {}
        for k in _SEGMENT_INTS:
            v = s.get(k)
            sizes[k] = v if type(v) is int and 0 <= v < MAX_BYTES else _size(s, k, where, required=k == "total_size")
        device = sizes["device"] or 0
        if device >= MAX_DEVICES:
            raise _bad(f"{where}['device']", "a device index", device)
        total = sizes["total_size"] or 0
        kind = s.get("segment_type")
        if kind is not None and type(kind) is not str:
            raise _bad(f"{where}['segment_type']", "a string", kind)
        blocks = s.get("blocks")
        if blocks is None:
            blocks = []
        elif type(blocks) is not list and type(blocks) is not tuple:
            raise _bad(f"{where}['blocks']", "a list", blocks)
        n, alloc_blocks, inactive, largest, by_site, block_frames = self.block_list(blocks, f"{where}['blocks']")
        allocated = sizes["allocated_size"] if sizes["allocated_size"] is not None else alloc_blocks
        frames = s.get("frames") or block_frames
        site = self.site(frames, f"{where}['frames']")
        expandable = s.get("is_expandable") is True
        row = {"device": device, "address": sizes["address"], "total_size": total, "allocated_size": allocated,
               "active_size": sizes["active_size"], "stream": sizes["stream"], "segment_type": kind,
               "blocks": n, "site": site, "expandable": expandable}
        got = _Seg(device, total, allocated, sizes["active_size"], n, inactive, largest,
                   split=bool(inactive) and inactive < total, expandable=expandable, site=site,
                   kind=kind, row=row, active_by_site=by_site)
        self.segs[key] = got
        return got


def summarize(snap: dict[str, Any]) -> Summary:
    """Check and aggregate a loaded snapshot (see the module doc). SnapshotError if malformed."""
    out = Summary()
    w = _Walker()
    segments = snap["segments"]
    w.visit(len(segments))
    # each distinct segment object once, in order of first appearance, with its reference count
    # (both built at C speed: a list of 3 million references to one dict is one summary)
    counts = Counter(map(id, segments))
    objects = dict(zip(map(id, segments), segments))
    order = 0
    for key, n in counts.items():
        obj = objects[key]
        try:
            seg = w.segment(obj, "segments[#]")
        except SnapshotError as exc:
            first = next(i for i, s in enumerate(segments) if s is obj)
            raise SnapshotError(str(exc).replace("segments[#]", f"segments[{first}]")) from None
        dev = out.devices.setdefault(seg.device, DeviceTotals())
        dev.segments += n
        dev.reserved += n * seg.total
        dev.allocated += n * seg.allocated
        dev.active += n * (seg.active if seg.active is not None else seg.allocated)
        dev.blocks += n * seg.blocks
        if seg.split:
            dev.inactive_split += n * seg.inactive
        dev.largest_free_block = max(dev.largest_free_block, seg.largest_inactive)
        dev.expandable += n * seg.expandable
        bucket = seg.total.bit_length()
        dev.sizes[bucket] = dev.sizes.get(bucket, 0) + n
        group = dev.sites.get((seg.site, seg.kind))
        if group is None:
            group = dev.sites[(seg.site, seg.kind)] = [0, 0, 0]
        group[0] += n
        group[1] += n * seg.total
        group[2] += n * seg.allocated
        for site, b in seg.active_by_site.items():
            dev.allocated_sites[site] = dev.allocated_sites.get(site, 0) + n * b
        out.segments += n
        for _ in range(min(n, TOP_SEGMENTS)):  # the same segment may fill several of the top places
            if len(out.largest) < TOP_SEGMENTS or seg.total > out.largest[0][0]:
                _push_largest(out.largest, (seg.total, order, seg.row))
                order += 1
    del counts, objects
    traces = snap.get("device_traces")
    if traces is not None:
        if not isinstance(traces, (list, tuple)):
            raise _bad("device_traces", "a list", traces)
        if len(traces) > MAX_DEVICES:
            raise SnapshotError(f"not a CUDA memory snapshot: {len(traces):,} device traces")
        cache: dict[int, tuple[int, dict[str, int], list[dict[str, Any]]]] = {}
        for dev_index, trace in enumerate(traces):
            w.visit()
            out.traces.append(_trace(w, cache, trace, dev_index, out))
    settings = snap.get("allocator_settings")
    if isinstance(settings, dict):
        out.settings = {k: v for k, v in settings.items() if isinstance(k, str)
                        and (v is None or isinstance(v, (str, bool)) or
                             (isinstance(v, (int, float)) and math.isfinite(v)))}
    return out


def _push_largest(heap: list[tuple[int, int, dict[str, Any]]], item: tuple[int, int, dict[str, Any]]) -> None:
    import heapq

    if len(heap) < TOP_SEGMENTS:
        heapq.heappush(heap, item)
    else:
        heapq.heapreplace(heap, item)


def _trace(w: _Walker, cache: dict[int, tuple[int, dict[str, int], list[dict[str, Any]]]],
           trace: Any, dev: int, out: Summary) -> dict[str, Any]:
    """Entry counts by action of one device's trace, and its oom entries (once per list)."""
    where = f"device_traces[{dev}]"
    key = id(trace)
    got = cache.get(key)
    if got is None:
        if not isinstance(trace, (list, tuple)):
            raise _bad(where, "a list", trace)
        counts: dict[str, int] = {}
        ooms: list[dict[str, Any]] = []
        entries: dict[int, tuple[str, dict[str, Any] | None]] = {}
        for i, e in enumerate(trace):
            w.visit()
            done = entries.get(id(e))
            if done is None:
                d = _dict(e, f"{where}[{i}]")
                action = _text(d, "action", f"{where}[{i}]") or "?"
                oom = None
                if action == "oom":
                    oom = {"size": _size(d, "size", f"{where}[{i}]"),
                           "device_free": _size(d, "device_free", f"{where}[{i}]"),
                           "stream": _size(d, "stream", f"{where}[{i}]"),
                           "time_us": _size(d, "time_us", f"{where}[{i}]"),
                           "site": w.site(d.get("frames"), f"{where}[{i}]['frames']")}
                done = entries[id(e)] = (action, oom)
            counts[done[0]] = counts.get(done[0], 0) + 1
            if done[1] is not None:
                ooms.append(done[1])
        got = cache[key] = (len(trace), counts, ooms)
    entries_n, counts, ooms = got
    for o in ooms:
        if len(out.ooms) < MAX_OOMS:
            out.ooms.append({**o, "device": dev})
        else:
            out.ooms_dropped += 1
    return {"device": dev, "entries": entries_n, "actions": dict(counts)}

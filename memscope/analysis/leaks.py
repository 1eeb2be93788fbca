"""Leaks: tensor groups whose memory grows steadily from inventory to inventory.

Pure functions over ``inventories`` / ``inventory_groups`` / ``leak_holders`` rows (no torch).
A group is one signature (category, dtype, shape, device, requires_grad, grad_fn type); its size
at an inventory is ``bytes + graph_bytes`` (graph bytes: saved tensors its autograd graphs keep
alive), 0 when absent.

The verdict (``growth``): after warm-up (inventories before ``WARMUP_STEPS`` are ignored: lazy
optimizer state appears in steps 0 and 1), the group's size rose at every one of the last
``MIN_INCREMENTS`` or more inventories, up to the last one, at a steady rate (the fastest
per-step rate at most ``MAX_RATE_RATIO`` times the slowest). Not leaks: one-time growth, a
bounded buffer that fills then plateaus, an evaluation spike that comes back down.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from memscope.constants import WARMUP_STEPS

if TYPE_CHECKING:
    from memscope.store.reader import RunReader

MIN_INCREMENTS = 3
MAX_RATE_RATIO = 4.0
SIG_COLUMNS = ("category", "dtype", "shape", "device", "requires_grad", "grad_fn")

Sig = tuple[Any, ...]


@dataclass
class Growth:
    first_step: int
    last_step: int
    bytes_per_step: float
    tensors_per_step: float


@dataclass
class Leak:
    bytes_per_step: int
    tensors_per_step: float
    shape: list[int] | None
    dtype: str | None
    category: str
    held_by: str | None
    site: str | None
    module: str | None
    first_step: int
    last_step: int
    grad_fn: str | None = None
    bytes_now: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"bytes_per_step": self.bytes_per_step, "tensors_per_step": self.tensors_per_step,
                "shape": self.shape, "dtype": self.dtype, "category": self.category,
                "held_by": self.held_by, "site": self.site, "module": self.module,
                "first_step": self.first_step, "last_step": self.last_step}


def growth(points: Sequence[tuple[int, int, int]]) -> Growth | None:
    """``points``: (step, bytes, count) at every inventory, in step order. A steady growth up to
    the last point, or None."""
    pts = [p for p in points if p[0] >= WARMUP_STEPS]
    if len(pts) < MIN_INCREMENTS + 1:
        return None
    i = len(pts) - 1
    while i > 0 and pts[i][1] > pts[i - 1][1]:
        i -= 1
    run = pts[i:]
    if len(run) < MIN_INCREMENTS + 1:
        return None
    rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(run, run[1:]) if b[0] > a[0]]
    if not rates or min(rates) <= 0 or max(rates) > MAX_RATE_RATIO * min(rates):
        return None
    span = run[-1][0] - run[0][0]
    return Growth(run[0][0], run[-1][0], (run[-1][1] - run[0][1]) / span,
                  (run[-1][2] - run[0][2]) / span)


def series(steps: Sequence[int], rows: Iterable[dict[str, Any]]) -> dict[Sig, list[tuple[int, int, int]]]:
    """Per signature, (step, bytes + graph_bytes, count) at every inventory step (0 if absent)."""
    by: dict[Sig, dict[int, tuple[int, int]]] = {}
    for r in rows:
        sig = tuple(r[c] for c in SIG_COLUMNS)
        d = by.setdefault(sig, {})
        b, c = d.get(r["step"], (0, 0))
        d[r["step"]] = (b + int(r["bytes"] or 0) + int(r["graph_bytes"] or 0), c + int(r["count"] or 0))
    return {sig: [(s, *d.get(s, (0, 0))) for s in steps] for sig, d in by.items()}


def find_leaks(steps: Sequence[int], rows: Iterable[dict[str, Any]],
               holders: Iterable[dict[str, Any]] = ()) -> list[Leak]:
    """Leaks from one process's inventory rows, most bytes per step first."""
    # holder rows come from two places: the holder search (held_by) and creation-site capture
    # (site, module; schema 4); the first non-null value of each field wins
    held: dict[Sig, dict[str, Any]] = {}
    for h in holders:
        sig = tuple(h[c] for c in SIG_COLUMNS)
        d = held.setdefault(sig, {"held_by": None, "site": None, "module": None})
        for f in d:
            if d[f] is None and h.get(f) is not None:
                d[f] = h[f]
    out: list[Leak] = []
    for sig, pts in series(steps, rows).items():
        g = growth(pts)
        if g is None or g.bytes_per_step < 1:
            continue
        h = held.get(sig, {})
        out.append(Leak(bytes_per_step=int(round(g.bytes_per_step)),
                        tensors_per_step=round(g.tensors_per_step, 3),
                        shape=_shape(sig[2]), dtype=sig[1], category=sig[0],
                        held_by=h.get("held_by"), site=h.get("site"), module=h.get("module"),
                        first_step=g.first_step, last_step=g.last_step, grad_fn=sig[5],
                        bytes_now=pts[-1][1]))
    out.sort(key=lambda lk: (-lk.bytes_per_step, lk.category, str(lk.shape)))
    return out


def _shape(text: Any) -> list[int] | None:
    try:
        v = json.loads(text)
        return v if isinstance(v, list) else None
    except (TypeError, ValueError):
        return None


# -- reading a run file --------------------------------------------------------------------------

def has_inventories(reader: "RunReader") -> bool:
    return bool(reader.scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'inventories'"))


def inventory_steps(reader: "RunReader", proc: int) -> list[int]:
    if not has_inventories(reader):
        return []
    return [int(r["step"]) for r in reader.query(
        "SELECT step FROM inventories WHERE proc = ? ORDER BY step", (proc,))]


def leaks_of(reader: "RunReader", proc: int | None) -> list[Leak]:
    if proc is None or not has_inventories(reader):
        return []
    steps = inventory_steps(reader, proc)
    rows = reader.query("SELECT * FROM inventory_groups WHERE proc = ?", (proc,))
    holders = reader.query("SELECT * FROM leak_holders WHERE proc = ? ORDER BY step", (proc,))
    return find_leaks(steps, rows, holders)


@dataclass
class GroupDiff:
    category: str
    dtype: str | None
    shape: list[int] | None
    grad_fn: str | None
    device: str | None
    count_from: int
    count_to: int
    bytes_from: int
    bytes_to: int

    @property
    def bytes_delta(self) -> int:
        return self.bytes_to - self.bytes_from

    @property
    def count_delta(self) -> int:
        return self.count_to - self.count_from


def diff(reader: "RunReader", proc: int, a: int, b: int) -> list[GroupDiff]:
    """Groups whose bytes or counts changed between inventories ``a`` and ``b``, largest change
    first (bytes include graph bytes)."""
    rows = reader.query("SELECT * FROM inventory_groups WHERE proc = ? AND step IN (?, ?)", (proc, a, b))
    ser = series([a, b], rows)
    out = []
    for sig, ((_, ba, ca), (_, bb, cb)) in ser.items():
        if ba == bb and ca == cb:
            continue
        out.append(GroupDiff(sig[0], sig[1], _shape(sig[2]), sig[5], sig[3], ca, cb, ba, bb))
    out.sort(key=lambda d: (-abs(d.bytes_delta), d.category, str(d.shape)))
    return out


def fix_how(leak: Leak) -> str:
    """The likely fix for a leak, from what it is."""
    where = f" in {leak.held_by}" if leak.held_by else ""
    if leak.site:
        where += f" (at {leak.site})"
    if leak.grad_fn and leak.shape == []:
        return (f"store loss.item() (a Python float){where} instead of the loss tensor: "
                "the tensor keeps its whole autograd graph and saved activations alive")
    if leak.grad_fn:
        return (f"store t.detach(){where} (or .cpu()/.item()): tensors with a grad_fn keep "
                "their autograd graph alive")
    return f"clear or bound the container{where} (collections.deque(maxlen=N), or drop entries once used)"


def suggestions(leaks: Sequence[Leak], steps: int) -> list[dict[str, Any]]:
    """``fix_leak`` suggestions: the saving is bytes_per_step x the run's completed steps (what
    the leak accumulates over a run this long)."""
    out = []
    for lk in leaks:
        what = f"{lk.category} {lk.dtype} {lk.shape}" + (f" ({lk.grad_fn})" if lk.grad_fn else "")
        out.append({
            "technique": "fix_leak",
            "estimated_saving_bytes": int(lk.bytes_per_step * max(steps, 0)),
            "evidence": (f"{what} grows by {lk.bytes_per_step} bytes/step "
                         f"({lk.tensors_per_step:g} tensors/step) from step {lk.first_step} to "
                         f"{lk.last_step}" + (f", held by {lk.held_by}" if lk.held_by else "")),
            "how": fix_how(lk),
        })
    return out

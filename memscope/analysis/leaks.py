"""Leaks: tensor groups whose memory grows steadily from inventory to inventory.

Pure functions over ``inventories`` / ``inventory_groups`` / ``leak_holders`` rows (no torch).
A group is one signature (category, dtype, shape, device, requires_grad, grad_fn type); its size
at an inventory is ``bytes + graph_bytes + graph_nodes x node bytes`` (saved tensors and retained
autograd nodes its graphs keep alive; a node's bytes measured on the run where it can be,
:mod:`~memscope.analysis.node_cost`), 0 when absent.

The verdict (``growth``) looks at the inventories from ``WARMUP_STEPS`` on (lazy optimizer state
appears in steps 0 and 1), and needs ``MIN_INVENTORIES`` of them (``leak_check`` says when a run
has fewer: "no leaks" is never said without having looked).

* A drop that gives back more than half of what the group gained since its last low is a
  *reset* (a buffer cleared, a list rebuilt, an epoch's metrics emptied); smaller drops are noise.
* Without resets: a leak rose at ``MIN_INCREMENTS`` or more inventories, kept rising up to the end
  (no pause of two inventories or more longer than any spacing between its rises: a warm-up that
  fills then stays, or a bounded buffer, plateaus), at a steady rate (the second half's rate within
  ``MAX_RATE_RATIO`` of the first's: not a one-time jump).
* Optimizer state is never a leak: it is what the optimizer keeps by design, bounded by its
  settings (LBFGS's history grows for ``history_size`` iterations, then stays).
* With resets, growth must persist across cycles: the last low (after the last reset) is above
  the low before it and above everything the first complete cycle held. A fill-and-clear
  buffer's lows never climb over a full buffer, whatever step the run ends on or however the
  inventories fall in its cycle; a leak beside it does, after enough cycles.
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from memscope.analysis.node_cost import ESTIMATE, NodeCost, node_cost
from memscope.constants import WARMUP_STEPS
from memscope.units import human_bytes

if TYPE_CHECKING:
    from memscope.store.reader import RunReader

MIN_INCREMENTS = 3
MIN_INVENTORIES = MIN_INCREMENTS + 1  # after warm-up, for any verdict
MAX_RATE_RATIO = 4.0
PAUSE_OVER_GROWTH = 2.0  # a pause is longer than this times the growth before it (else: a gap)
ACCELERATING = 2.0  # the second half's rate at least this times the first's: accelerating
RESET_SHARE = 0.2  # a drop to within this share of the gain since the low resets; a smaller one is a drain
SIG_COLUMNS = ("category", "dtype", "shape", "device", "requires_grad", "grad_fn")

Sig = tuple[Any, ...]
Point = tuple[int, int, int, int, int]  # step, size, tensors, graph nodes, saved bytes of graphs


@dataclass
class Growth:
    first_step: int
    last_step: int
    bytes_per_step: float
    tensors_per_step: float
    nodes_per_step: float = 0.0
    every: float = 1.0  # typical steps between the rises (30: it grows at evaluations only)
    saved_per_step: float = 0.0  # bytes of tensors the kept graphs still save (0 after backward)
    rate_first: float = 0.0  # bytes per step over the first half of the growth (by steps)
    rate_last: float = 0.0  # ... and over the second half


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
    graph_nodes_per_step: float = 0.0  # autograd nodes retained per step
    created_at: str | None = None  # where the tensors were made (``site``: where they are kept)
    every: float = 1.0  # typical steps between its rises (1: every step)
    saved_bytes_per_step: int = 0  # of bytes_per_step: tensors its graphs still save for backward
    node_cost: NodeCost = ESTIMATE  # what each retained autograd node is counted at
    sig: tuple[Any, ...] = ()  # the group's SIG_COLUMNS values as stored (its rows, for plots)
    rate_first: float = 0.0  # bytes per step in the first half of its growth
    rate_last: float = 0.0  # ... in the second half (ACCELERATING times the first or more: it accelerates)
    cause: str | None = None  # what makes it accelerate, when memscope saw it (hooks that keep coming)

    @property
    def accelerating(self) -> bool:
        """It grows faster and faster: each step keeps more than the one before (a hook
        registered every step that keeps a tensor at each call)."""
        return self.rate_first > 0 and self.rate_last >= ACCELERATING * self.rate_first \
            and self.last_step - self.first_step >= 8

    @property
    def kind(self) -> str:
        """``graph``: a growing chain of autograd nodes with few tensor bytes (``total_loss +=
        loss``); ``tensors``: tensors that pile up."""
        if self.graph_nodes_per_step > 0 and self.tensors_per_step <= 0:
            return "graph"
        return "tensors"

    def as_json(self) -> dict[str, Any]:
        dtype, layout = split_dtype(self.dtype)
        return {"bytes_per_step": self.bytes_per_step, "tensors_per_step": self.tensors_per_step,
                "shape": self.shape, "dtype": dtype, "category": self.category, "layout": layout,
                "held_by": self.held_by, "site": self.site, "module": self.module,
                "first_step": self.first_step, "last_step": self.last_step,
                # additive to memscope.report/1
                "kind": self.kind, "graph_nodes_per_step": self.graph_nodes_per_step,
                "created_at": self.created_at, "grows_every_steps": self.every,
                "node_bytes": self.node_cost.bytes, "node_bytes_measured": self.node_cost.measured,
                "accelerating": self.accelerating, "bytes_per_step_now": int(round(self.rate_last)),
                "cause": self.cause}


def split_dtype(text: str | None) -> tuple[str | None, str]:
    """A group's dtype text as (dtype, layout): ``"float32 sparse_coo"`` -> ("float32",
    "sparse_coo"); a strided tensor's is ("float32", "strided")."""
    if text is None or " " not in text:
        return text, "strided"
    dtype, layout = text.split(" ", 1)
    return dtype, layout


@dataclass
class LeakCheck:
    """Whether the run had enough inventories for a verdict ("no leaks" only after looking)."""

    inventories: int  # inventories from the warm-up on
    needed: int
    off: bool = False  # inventories were turned off (--inventory-every 0)
    steps: int | None = None  # completed steps from the warm-up on (None: not known)
    recorded: bool = True  # False: no step of the run was recorded at all
    last_inventory: int | None = None  # the step of the last inventory
    last_step: int | None = None  # the last completed step
    why_sparse: str | None = None  # what the agent said made inventories costly (gc state)

    @property
    def verdict(self) -> str:
        return "ok" if self.inventories >= self.needed else "insufficient"

    def as_json(self) -> dict[str, Any]:
        return {"inventories": self.inventories, "needed": self.needed, "verdict": self.verdict,
                # additive to memscope.report/1: how far the inventories reached
                "last_inventory_step": self.last_inventory, "last_step": self.last_step}

    def coverage(self) -> str | None:
        """A line when the inventories stopped well before the run's end (the time budget
        stretched them past it): a verdict about the end of the run then rests on older evidence.
        The default schedule keeps the last inventory within about 1/16 of the run of its end."""
        if self.off or self.last_inventory is None or self.last_step is None:
            return None
        behind = self.last_step - self.last_inventory
        if behind <= max(16, self.last_step // 8):
            return None
        why = f" ({self.why_sparse})" if self.why_sparse else ""
        return (f"the last tensor inventory was at step {self.last_inventory} of {self.last_step}: "
                f"inventories took more than the 1% time budget allows on steps this short{why}; "
                "attach with --inventory-every N to take one every N steps whatever they cost")

    def advice(self) -> str:
        """What the user can do about an insufficient check (one line)."""
        if not self.recorded:
            return ("no training step was recorded, so no inventory was taken (the recording "
                    "lines say why, if memscope knows)")
        if self.off:
            return "tensor inventories were off (--inventory-every 0): attach without it to look for leaks"
        have = (f"{self.inventories} of the {self.needed} inventories a verdict needs from step "
                f"{WARMUP_STEPS} on")
        if self.steps is not None and self.inventories >= self.steps:  # one at every step already
            return f"{have}: run at least {WARMUP_STEPS + self.needed} steps"
        return (f"{have}: run at least {WARMUP_STEPS + self.needed} steps, or attach with "
                "--inventory-every 1")


# -- the verdict -------------------------------------------------------------------------------

def growth(points: Sequence[tuple[int, ...]]) -> Growth | None:
    """``points``: (step, size, count[, graph nodes]) at every inventory, in step order. A steady
    growth that persists up to the last point, or None."""
    pts: list[Point] = [(int(p[0]), int(p[1]), int(p[2]), int(p[3]) if len(p) > 3 else 0,
                         int(p[4]) if len(p) > 4 else 0)
                        for p in points if p[0] >= WARMUP_STEPS]
    if len(pts) < MIN_INVENTORIES:
        return None
    lows = _cycle_lows(pts)
    if len(lows) == 1:
        return _rising(pts)
    return _rising_lows(pts, lows) or _since_last_reset(pts, lows)


def _cycle_lows(pts: list[Point]) -> list[int]:
    """Index of the low point of each cycle (the first point starts the first one)."""
    lows = [0]
    low = high = pts[0][1]
    for i in range(1, len(pts)):
        v, prev = pts[i][1], pts[i - 1][1]
        if v < prev and (v <= low or v - low < RESET_SHARE * (high - low)):
            if lows[-1] == i - 1:
                lows[-1] = i  # still falling (or falling from the first point): the same low
            else:
                lows.append(i)
            low = high = v
        else:
            high = max(high, v)
    return lows


def _rising(pts: list[Point]) -> Growth | None:
    """Growth without resets. Inventories are unevenly spaced (dense first, then thinning, then
    stretched by the time budget), so every rule here is in step numbers, not inventory indices:
    a rise seen at every inventory is a rise at every inventory however far apart they are."""
    rises = [i for i in range(1, len(pts)) if pts[i][1] > pts[i - 1][1]]
    if len(rises) < MIN_INCREMENTS:
        return None
    gaps = [pts[b][0] - pts[a][0] for a, b in zip(rises, rises[1:])]
    typical = max(statistics.median(gaps), 1) if gaps else 1
    # the growth now: back from the last rise while no pause separates two rises. A pause is two
    # or more inventories that saw no rise over more than twice the typical spacing of rises
    # (a warm-up that filled, then a leak that started later)
    # A pause is also more than twice as long as the growth before it: a leak that keeps a
    # tensor on some steps only (an exception raised now and then) has gaps of any length
    # between its rises, and is measured from its first occurrence
    first = len(rises) - 1
    while first > 0 and not (rises[first] - rises[first - 1] > 2
                             and (gap := pts[rises[first]][0] - pts[rises[first - 1]][0]) > 2 * typical
                             and gap > PAUSE_OVER_GROWTH * (pts[rises[first - 1]][0] - pts[rises[0] - 1][0])):
        first -= 1
    window = pts[rises[first] - 1:]
    if len(rises) - first < MIN_INCREMENTS:
        return None
    # stopped: two or more inventories since the last rise, over more steps than any spacing of
    # the rises in this growth (a warm-up cache full, a buffer at its bound)
    # (falling at every inventory since is not stopped: a consumer's drains, one after another)
    tail = pts[-1][0] - pts[rises[-1]][0]
    drained = all(q[1] < p[1] for p, q in zip(pts[rises[-1]:], pts[rises[-1] + 1:]))
    if len(pts) - 1 - rises[-1] >= 2 and tail > max(gaps[first:], default=1) and not drained:
        return None
    if _at_its_bound(pts, rises[first:]):
        return None
    if not _steady(window) or not _through_drains(window):
        return None
    # the rate: what it kept from its first rise to its last inventory, every part (tensors,
    # saved bytes, graph nodes) over the same span. Drops where none of its tensors went (the
    # graph nodes it shares with another group charged there at some inventories: their walks'
    # order) are no drains: the ends are what it kept
    g = _rate(window[0], window[-1])
    if not _monotone(window) and not _tensors_kept(window):
        # drained now and then: from its lowest to where it ends (every part from the same two
        # inventories, so that the bytes less the nodes' bytes are the tensors' own rate)
        low = min(window, key=lambda p: p[1])
        g = _rate(low, _end_point(window), start=window[0][0])
        g.last_step = window[-1][0]
    g.rate_first, g.rate_last = (_halves(window) if _monotone(window) else _rise_rates(window)) \
        or (g.bytes_per_step, g.bytes_per_step)
    # how often it grew, when inventories were denser than its rises (else: at every one seen)
    flat = len(window) - 1 - (len(rises) - first)
    g.every = float(statistics.median(gaps[first:])) if gaps[first:] and flat > len(window) // 2 else 1.0
    return g


def _at_its_bound(pts: list[Point], rises: list[int]) -> bool:
    """Filled, then jittering at a bound: a bounded queue its consumer thread takes from as the
    scheduler lets it (7 items at most steps' end, 8 at some). Its rises since the last one it
    kept (the level never fell back to where it was before it) were all undone, none went more
    than one kept rise above the level kept, and the level has been kept for two or more
    inventories over more steps than any spacing of the kept rises: it stopped there."""
    floor = list(itertools.accumulate((p[1] for p in reversed(pts)), min))[::-1]  # the least from each on
    kept = [i for i in rises if floor[i] > pts[i - 1][1]]
    if not kept or kept[-1] == rises[-1]:
        return False  # growing still, or the last rise is the stop rule's to judge
    k = kept[-1]
    step_up = max(pts[i][1] - pts[i - 1][1] for i in kept)
    spacing = max((pts[b][0] - pts[a][0] for a, b in zip(kept, kept[1:])), default=1)
    return (len(pts) - k >= 3 and pts[-1][0] - pts[k][0] > spacing
            and max(p[1] for p in pts[k:]) <= floor[k] + step_up)


def _outgrown(window: list[Point]) -> bool:
    """A growth with drops in it (a consumer that drains part of a queue now and then; a buffer
    cleared while inventories fall anywhere in its cycle) has outgrown its range: everything its
    last quarter (by steps) holds is above everything its first quarter held. A bounded buffer
    never does; a monotone growth is not asked."""
    if _monotone(window):
        return True
    a, z = window[0][0], window[-1][0]
    first = [p[1] for p in window if p[0] <= a + (z - a) / 4]
    last = [p[1] for p in window if p[0] >= z - (z - a) / 4]
    return min(last) > max(first)


def _monotone(window: list[Point]) -> bool:
    return all(q[1] >= p[1] for p, q in zip(window, window[1:]))


def _through_drains(window: list[Point]) -> bool:
    """Outgrown its range (:func:`_outgrown`), or it had before its last drop, and has not
    fallen since: a consumer's drain that leaves the queue below what it held a while ago does
    not withdraw a leak that was one before it (the drain is no reset: it kept part of the
    gain). Only the last drop is looked behind: a bounded queue drained now and then has not
    outgrown its range before any of its drops."""
    if _outgrown(window):
        return True
    j = max((i for i in range(1, len(window)) if window[i][1] < window[i - 1][1]), default=0)
    before = window[:j]
    if len(before) < MIN_INVENTORIES or not _monotone(window[j:]):
        return False
    rises = sum(1 for p, q in zip(before, before[1:]) if q[1] > p[1])
    return rises >= MIN_INCREMENTS and _steady(before) and _outgrown(before)


def _tensors_kept(window: list[Point]) -> bool:
    """None of its tensors went at any inventory (their count never fell): a drop in its size
    is then in what its graphs are charged, not in what it keeps."""
    return all(q[2] >= p[2] for p, q in zip(window, window[1:]))


def _end_point(window: list[Point]) -> Point:
    """The inventory where a growth ends: its last; with drops in it (a consumer's drains now
    and then), the median of its last quarter's inventories (by size; the lower of two), so a
    drain at the last inventory does not decide its rate."""
    if _monotone(window):
        return window[-1]
    a, z = window[0][0], window[-1][0]
    last = sorted((p for p in window if p[0] >= z - (z - a) / 4), key=lambda p: (p[1], p[0]))
    return last[(len(last) - 1) // 2]


def _halves(window: list[Point]) -> tuple[float, float] | None:
    """The growth rates (bytes per step) of the window's first and second half, by steps, from
    its lower envelope (what stays: a drain's dip at the midpoint does not halve a rate) to its
    end (:func:`_end_point`); None when there is no point between its ends."""
    a, z = window[0], window[-1]
    mid = (a[0] + z[0]) / 2
    m = max((p for p in window[1:-1] if p[0] <= mid), key=lambda p: p[0], default=window[1])
    end_step, end = _end_point(window)[:2]
    if not a[0] < m[0] < end_step:
        return None
    low_a = min(p[1] for p in window)
    low_m = min(p[1] for p in window if p[0] >= m[0])
    return (low_m - low_a) / (m[0] - a[0]), (end - low_m) / (end_step - m[0])


def _steady(window: list[Point]) -> bool:
    """The growth rate of the window's second half (by steps) is within MAX_RATE_RATIO of the
    first half's, and both are positive."""
    halves = _halves(window) if _monotone(window) else _rise_rates(window)
    if halves is None:
        a, z = window[0], window[-1]
        return len(window) >= 2 and z[1] > a[1]
    r1, r2 = halves
    return r1 > 0 and r2 > 0 and max(r1, r2) <= MAX_RATE_RATIO * min(r1, r2)


def _rise_rates(window: list[Point]) -> tuple[float, float] | None:
    """With drops in it (drains): how fast it rises between them, in each half (by steps): the
    median slope of its rises. A deep drain moves where the level is, not how fast it grows.
    None unless the second half reached a new high: a bounded queue that jitters at its bound
    (one item taken, one put) rises as often as it falls, and never above its bound."""
    a, z = window[0][0], window[-1][0]
    mid = (a + z) / 2
    if max(p[1] for p in window if p[0] > mid) <= max(p[1] for p in window if p[0] <= mid):
        return 0.0, 0.0
    first: list[float] = []
    second: list[float] = []
    for p, q in zip(window, window[1:]):
        if q[1] > p[1]:
            (first if q[0] <= mid else second).append((q[1] - p[1]) / max(q[0] - p[0], 1))
    if not first or not second:
        return None
    return float(statistics.median(first)), float(statistics.median(second))


def _rising_lows(pts: list[Point], lows: list[int]) -> Growth | None:
    """Cycles: the last low is above everything the first complete cycle held (growth that
    persisted across the cycles since), and above the low before it (still growing)."""
    if len(lows) < 3:
        return None
    first = pts[lows[1]:lows[2]]  # the first complete cycle: from a reset to the next
    a, b, c = pts[lows[1]], pts[lows[-2]], pts[lows[-1]]
    if not (c[1] > b[1] and c[1] > max(p[1] for p in first)):
        return None
    return _rate(a, c)


def _since_last_reset(pts: list[Point], lows: list[int]) -> Growth | None:
    """Growth since the last reset that has outgrown every cycle before it: above everything
    they held, and longer than twice the longest of them (a queue its consumer emptied once,
    early, then fell behind for good; the consumer may have drained it while memscope's own work
    paused the training). A buffer cleared at the end of each cycle never does."""
    start = lows[-1]
    tail = pts[start:]
    if len(tail) < MIN_INVENTORIES or tail[-1][1] <= max(p[1] for p in pts[:start]):
        return None
    cycles = [pts[b][0] - pts[a][0] for a, b in zip(lows, lows[1:])]
    if tail[-1][0] - tail[0][0] <= 2 * max(cycles):
        return None
    return _rising(tail)


def _rate(a: Point, z: Point, start: int | None = None) -> Growth:
    """Every part's growth per step from ``a`` to ``z``, over the steps from ``start`` (``a``'s
    step unless given: a growth measured from its lowest point, which may come after its start)."""
    first = a[0] if start is None else start
    span = max(z[0] - first, 1)
    return Growth(first, z[0], (z[1] - a[1]) / span, (z[2] - a[2]) / span, (z[3] - a[3]) / span,
                  saved_per_step=(z[4] - a[4]) / span)


# -- series from rows ----------------------------------------------------------------------------

def series(steps: Sequence[int], rows: Iterable[dict[str, Any]],
           node_bytes: int = ESTIMATE.bytes) -> dict[Sig, list[Point]]:
    """Per signature, (step, size, count, graph nodes, saved bytes) at every inventory step (0 if
    absent); a retained node counts ``node_bytes``."""
    by: dict[Sig, dict[int, tuple[int, int, int, int]]] = {}
    for r in rows:
        sig = tuple(r[c] for c in SIG_COLUMNS)
        d = by.setdefault(sig, {})
        nodes = int(r.get("graph_nodes") or 0)
        saved = int(r["graph_bytes"] or 0)
        b, c, n, g = d.get(r["step"], (0, 0, 0, 0))
        d[r["step"]] = (b + int(r["bytes"] or 0) + saved + nodes * node_bytes,
                        c + int(r["count"] or 0), n + nodes, g + saved)
    return {sig: [(s, *d.get(s, (0, 0, 0, 0))) for s in steps] for sig, d in by.items()}


def find_leaks(steps: Sequence[int], rows: Iterable[dict[str, Any]],
               holders: Iterable[dict[str, Any]] = (), cost: NodeCost = ESTIMATE) -> list[Leak]:
    """Leaks from one process's inventory rows, most bytes per step first; retained autograd
    nodes count ``cost`` bytes each."""
    # holder rows come from two places: the holder search (held_by) and creation-site capture
    # (site, module; schema 4); the first non-null value of each field wins, except that a
    # storing line (a site that is not the row's creating line) beats a creating line given
    # because the window saw no store: a later, longer arming saw what the first one missed
    held: dict[Sig, dict[str, Any]] = {}
    for h in holders:
        sig = tuple(h[c] for c in SIG_COLUMNS)
        d = held.setdefault(sig, {"held_by": None, "site": None, "module": None, "created_at": None})
        if d["site"] is not None and d["site"] == d["created_at"] and h.get("site") is not None \
                and h.get("created_at") is not None and h["site"] != h["created_at"]:
            d["site"] = h["site"]
        for f in d:
            if d[f] is None and h.get(f) is not None:
                d[f] = h[f]
    out: list[Leak] = []
    for sig, pts in series(steps, rows, cost.bytes).items():
        if sig[0] == "optimizer_state":
            continue  # the optimizer's own, bounded by its settings (LBFGS's history_size)
        g = growth(pts)
        if g is None or g.bytes_per_step < 1:
            continue
        h = held.get(sig, {})
        out.append(Leak(bytes_per_step=int(round(g.bytes_per_step)),
                        tensors_per_step=round(g.tensors_per_step, 3),
                        shape=_shape(sig[2]), dtype=sig[1], category=sig[0],
                        held_by=h.get("held_by"), site=h.get("site"), module=h.get("module"),
                        first_step=g.first_step, last_step=g.last_step, grad_fn=sig[5],
                        created_at=h.get("created_at"), every=g.every,
                        saved_bytes_per_step=int(round(max(g.saved_per_step, 0))),
                        bytes_now=pts[-1][1], graph_nodes_per_step=round(max(g.nodes_per_step, 0), 3),
                        node_cost=cost, rate_first=g.rate_first, rate_last=g.rate_last,
                        sig=sig))
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
    return find_leaks(steps, rows, holders, node_cost(reader, proc))


def leak_check(reader: "RunReader", proc: int | None) -> LeakCheck:
    """How many inventories the verdict could use, against the number it needs."""
    steps = inventory_steps(reader, proc) if proc is not None else []
    off = False
    if proc is not None and not steps:
        opts = reader.query("SELECT options FROM processes WHERE id = ?", (proc,))
        try:
            off = bool(opts) and json.loads(opts[0]["options"] or "{}").get("inventory_every") == 0
        except (TypeError, ValueError, AttributeError):
            off = False
    from memscope.store.step_stats import scan_source

    done = reader.scalar(f"SELECT count(*) FROM {scan_source(reader, 'steps')} WHERE proc = ? AND status = 'ok'"
                         " AND step >= ?",
                         (proc, WARMUP_STEPS)) if proc is not None else None
    if done is not None and reader.version >= 9:  # folded steps: windows lie past the warm-up
        done += reader.scalar("SELECT coalesce(sum(steps), 0) FROM step_windows WHERE proc = ?"
                              " AND first_step >= ?", (proc, WARMUP_STEPS)) or 0
    any_step = proc is not None and reader.scalar("SELECT count(*) FROM steps WHERE proc = ?", (proc,))
    last_step = reader.scalar("SELECT max(step) FROM steps WHERE proc = ? AND status = 'ok'",
                              (proc,)) if proc is not None else None
    why = [e["message"] for e in reader.events("gc_state")] if steps else []
    return LeakCheck(sum(1 for s in steps if s >= WARMUP_STEPS), MIN_INVENTORIES, off,
                     int(done) if done is not None else None, recorded=bool(any_step),
                     last_inventory=steps[-1] if steps else None,
                     last_step=int(last_step) if last_step is not None else None,
                     why_sparse=str(why[0]) if why else None)


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
    first (bytes include graph bytes and retained nodes)."""
    rows = reader.query("SELECT * FROM inventory_groups WHERE proc = ? AND step IN (?, ?)", (proc, a, b))
    ser = series([a, b], rows, node_cost(reader, proc).bytes)
    out = []
    for sig, ((_, ba, ca, _na, _ga), (_, bb, cb, _nb, _gb)) in ser.items():
        if ba == bb and ca == cb:
            continue
        out.append(GroupDiff(sig[0], sig[1], _shape(sig[2]), sig[5], sig[3], ca, cb, ba, bb))
    out.sort(key=lambda d: (-abs(d.bytes_delta), d.category, str(d.shape)))
    return out


# -- what to do --------------------------------------------------------------------------------

def fix_how(leak: Leak) -> str:
    """The likely fix for a leak, from what it is."""
    where = f" in {leak.held_by}" if leak.held_by else ""
    if leak.site:
        where += f" (at {leak.site})"
    held = leak.held_by or ""
    if ".__traceback__" in held:
        kept = held.split(".__traceback__", 1)[1]
        return (f"keep the exception without its traceback (`e.with_traceback(None)`), or only "
                f"str(e){where}: each kept exception's traceback keeps every frame it went through "
                f"and their local variables alive ({kept.lstrip('.')}, with the autograd graph it carries)")
    if "<lru_cache maxsize=None" in held:
        return (f"bound the cache: @functools.lru_cache(maxsize=N) instead of maxsize=None{where}: it "
                "keeps one result per distinct argument for the whole run (or call cache_clear() "
                "when its entries are no longer needed)")
    if held.endswith(".queue"):
        return (f"bound the queue: queue.Queue(maxsize=N){where}, so that put() waits for its "
                "consumer (back-pressure) instead of keeping every step's tensors; or drain it "
                "faster (the consumer takes fewer items than the loop puts)")
    if leak.kind == "graph":
        name = _short(leak.held_by) if leak.held_by else "total_loss"
        return (f"accumulate Python numbers, not tensors: `{name} += loss.item()`{where}; adding "
                "a tensor that has a grad_fn chains every step's autograd graph onto it "
                f"(about {leak.graph_nodes_per_step:g} nodes a step, never freed)")
    if leak.grad_fn and leak.every >= 5:
        return (f"it grows every ~{leak.every:g} steps, not every step: if that is an evaluation, "
                "run it under `with torch.no_grad():` (its outputs then keep no autograd graph), "
                f"and store t.detach() or .item(){where}")
    if leak.grad_fn:
        store = (f"store loss.item() (a Python float){where} instead of the loss tensor"
                 if leak.shape == [] else f"store t.detach(){where} (or .cpu()/.item())")
        return f"{store}: {_graph_kept(leak)}"
    return f"clear or bound the container{where} (collections.deque(maxlen=N), or drop entries once used)"


def _graph_kept(leak: Leak) -> str:
    """What a kept tensor with a grad_fn keeps alive, as measured: its saved activations while
    backward has not run on it (retain_graph, or never), else only the graph's nodes."""
    nodes = f"{leak.graph_nodes_per_step:g} autograd nodes a step"
    if leak.saved_bytes_per_step > 0:
        return (f"each kept tensor keeps its autograd graph ({nodes}) and the activations it saved "
                f"for backward ({human_bytes(leak.saved_bytes_per_step)} a step) alive")
    if leak.graph_nodes_per_step > 0:
        return (f"each kept tensor keeps its autograd graph alive ({nodes}, "
                f"{leak.node_cost.phrase()}; backward already freed the activations it saved)")
    return "a tensor with a grad_fn keeps its autograd graph alive"


def _short(held_by: str) -> str:
    """The variable a person writes: ``__main__.train.<locals>.total_loss`` -> ``total_loss``."""
    return held_by.rsplit(".", 1)[-1] if "<" not in held_by.rsplit(".", 1)[-1] else held_by


def describe(leak: Leak) -> str:
    """What grows, in a few words: the group, or the retained graph nodes."""
    what = f"{leak.category} {leak.dtype} {leak.shape}" + (f" {leak.grad_fn}" if leak.grad_fn else "")
    if leak.kind == "graph":
        return f"autograd graph kept by {what}, {leak.graph_nodes_per_step:g} nodes/step"
    return what


def suggestions(leaks: Sequence[Leak], steps: int) -> list[dict[str, Any]]:
    """``fix_leak`` suggestions: the saving is bytes_per_step x the run's completed steps (what
    the leak accumulates over a run this long)."""
    out = []
    for lk in leaks:
        if lk.kind == "graph":
            grows = f"{describe(lk)}, about {human_bytes(lk.bytes_per_step)}/step ({lk.node_cost.phrase()})"
        else:
            grows = (f"{describe(lk)} grows by {human_bytes(lk.bytes_per_step)}/step "
                     f"({lk.tensors_per_step:g} tensors/step)")
        out.append({
            "technique": "fix_leak",
            "estimated_saving_bytes": int(lk.bytes_per_step * max(steps, 0)),
            "evidence": (f"{grows} from step {lk.first_step} to {lk.last_step}"
                         + (f", held by {lk.held_by}" if lk.held_by else "")),
            "how": fix_how(lk),
        })
    return out

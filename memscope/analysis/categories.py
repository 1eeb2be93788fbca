"""Memory by category over the steps, and each leaking group's growth: what the stacked category
chart and the leak plots of the dashboard, the HTML page and notebooks draw.

Pure functions over a :class:`memscope.store.reader.RunReader`; no drawing.

Two moments are measured, and each point says which (``at``); a chart draws one of them (the
inventories when the run has any):

* ``end``: a tensor inventory, taken at the boundary that closed the step: every live tensor by
  category (parameters, gradients, optimizer state, activations), a retained autograd graph
  counted with the tensors that keep it (its saved tensors, and its nodes at the run's measured
  cost, as the leak verdict counts them);
* ``peak``: a profiled step's breakdown at the step's peak (activations: the most saved for
  backward alive at once).

Each leaking group (a verdict of :mod:`memscope.analysis.leaks`) is taken out of its category and
stacked as a part of its own (``leak:0``, ``leak:1``... in the verdicts' order); ``other`` is the
process metric at that moment (CUDA allocated at the step's end / peak on a CUDA run, else host
RSS) minus the tensors counted. Downsampled in SQL: at most ``limit`` inventories are read (in
each of ``limit`` equal spans of steps, the one holding the most bytes), so a run of a million
steps costs what a short one does.

    with RunReader("run.db") as reader:
        cats = category_timeline(reader, proc=1, leaks=summary.leaks)
    cats.stack                # ["parameters", "gradients", "optimizer_state", "activations", "leak:0"]
    cats.points[-1].parts     # {"parameters": 2121768, ..., "leak:0": 5944440, "other": 340...}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from memscope.analysis.leaks import Leak, describe, has_inventories
from memscope.analysis.node_cost import node_cost
from memscope.store.reader import RunReader

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")
LABELS = {"parameters": "parameters", "gradients": "gradients", "optimizer_state": "optimizer state",
          "activations": "activations", "other": "other"}
MAX_POINTS = 400  # category points read at most (inventories and profiled steps each)


@dataclass(frozen=True)
class CategoryPoint:
    """Where memory went at one step: ``parts`` (the stack's keys, and ``other``) in bytes."""

    step: int
    t: float | None         # seconds since the run started: the step's end; None: no step row kept
    at: str                 # "end" (an inventory) | "peak" (a profiled step's breakdown)
    metric: int | None      # the process metric at that moment (None: not sampled)
    parts: dict[str, int]

    @property
    def tensors(self) -> int:
        """Bytes of the tensors counted (every part but ``other``)."""
        return sum(v for k, v in self.parts.items() if k != "other")


@dataclass(frozen=True)
class CategoryTimeline:
    """The category points of one process, in step order."""

    metric: str                                   # "cuda_allocated" or "rss": what ``other`` is taken from
    stack: list[str]                              # the parts to stack, bottom first (see :func:`stack_of`)
    labels: dict[str, str]                        # part -> label (a leak's: its group, raw data)
    points: list[CategoryPoint] = field(default_factory=list)   # the stack: one moment, step order
    profiled: list[CategoryPoint] = field(default_factory=list)  # breakdowns at profiled steps' peaks

    @property
    def at(self) -> str | None:
        """The moment of :attr:`points`: "end" (inventories) or "peak" (profiled steps)."""
        return self.points[0].at if self.points else None

    @property
    def metric_label(self) -> str:
        return "CUDA allocated" if self.metric == "cuda_allocated" else "host RSS"


@dataclass(frozen=True)
class LeakGrowth:
    """One leaking group's bytes at each inventory read, and the verdict's fitted rate as a line
    from ``fit[0]`` to ``fit[1]`` ((step, bytes) each)."""

    key: str                                      # its part in the category stack ("leak:0")
    label: str                                    # the group, in a few words (raw data)
    leak: Leak
    points: list[tuple[int, int]]                 # (step, bytes)
    fit: tuple[tuple[int, float], tuple[int, float]] | None


def stack_of(metric: str, leaks: int) -> list[str]:
    """The parts a stacked chart draws, bottom first. ``other`` only on CUDA: there the allocator
    holds tensors and little else, so what no tensor explains is worth seeing; host RSS is mostly
    the interpreter and its libraries (about 300 MiB of a small CPU run), which would flatten every
    category to a line (``other`` stays in each point's parts, for tooltips and tables)."""
    leak_keys = [f"leak:{i}" for i in range(leaks)]
    return [*CATEGORIES, *leak_keys, *(["other"] if metric == "cuda_allocated" else [])]


def category_timeline(reader: RunReader, proc: int | None, leaks: Sequence[Leak] = (),
                      limit: int = MAX_POINTS) -> CategoryTimeline:
    """The category points of ``proc``: its inventories, or without any, its profiled steps.
    One moment per chart: a stack alternating between a step's end and another's peak would
    zigzag by the activations alone."""
    metric = _metric(reader, proc)
    labels = dict(LABELS)
    for i, lk in enumerate(leaks):
        labels[f"leak:{i}"] = "leak: " + describe(lk)
    if proc is None:
        return CategoryTimeline(metric, stack_of(metric, len(leaks)), labels)
    origin = _origin(reader)
    profiled = _profiled_points(reader, proc, metric, limit, origin)
    points = _inventory_points(reader, proc, metric, leaks, limit, origin) or profiled
    return CategoryTimeline(metric, stack_of(metric, len(leaks)), labels, points, profiled)


def leak_growth(reader: RunReader, proc: int | None, leaks: Sequence[Leak],
                limit: int = MAX_POINTS) -> list[LeakGrowth]:
    """Each leak's group at the inventories (at most ``limit`` of them, those with the most bytes
    in their span of steps), with the verdict's fitted line over the steps it grew in."""
    if proc is None or not leaks or not has_inventories(reader):
        return []
    steps = _picked_inventories(reader, proc, limit)
    cost = node_cost(reader, proc).bytes
    out = []
    for i, lk in enumerate(leaks):
        values = _group_bytes(reader, proc, lk, steps, cost)
        start = values.get(lk.first_step)
        if start is None:  # not among the picked inventories: read that one too
            start = _group_bytes(reader, proc, lk, [lk.first_step], cost).get(lk.first_step)
        fit = None
        if start is not None:
            fit = ((lk.first_step, float(start)),
                   (lk.last_step, start + lk.bytes_per_step * (lk.last_step - lk.first_step)))
        out.append(LeakGrowth(f"leak:{i}", describe(lk), lk, [(s, values.get(s, 0)) for s in steps], fit))
    return out


# -- reading -------------------------------------------------------------------------------------

def _metric(reader: RunReader, proc: int | None) -> str:
    if proc is not None and reader.scalar(
            "SELECT count(*) FROM (SELECT 1 FROM cuda_samples WHERE proc = ? AND allocated IS NOT NULL LIMIT 1)",
            (proc,)):
        return "cuda_allocated"
    return "rss"


def _origin(reader: RunReader) -> float | None:
    run = reader.run()
    return float(run["started"]) if run and run["started"] is not None else None


def _has(reader: RunReader, table: str) -> bool:
    return bool(reader.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)))


def _picked_inventories(reader: RunReader, proc: int, limit: int) -> list[int]:
    """Every inventory step of ``proc``, or past ``limit`` of them, in each of ``limit`` equal spans
    of steps the one holding the most bytes (SQLite's bare column comes from the max() row)."""
    n = int(reader.scalar("SELECT count(*) FROM inventories WHERE proc = ?", (proc,)) or 0)
    if n <= limit:
        rows = reader.query("SELECT step FROM inventories WHERE proc = ? ORDER BY step", (proc,))
    else:
        lo = reader.scalar("SELECT min(step) FROM inventories WHERE proc = ?", (proc,))
        hi = reader.scalar("SELECT max(step) FROM inventories WHERE proc = ?", (proc,))
        width = max((hi - lo + 1) / limit, 1.0)
        rows = reader.query("SELECT step, max(bytes + graph_bytes) FROM inventories WHERE proc = ?"
                            " GROUP BY CAST((step - ?) / ? AS INTEGER) ORDER BY step", (proc, lo, width))
    return [int(r["step"]) for r in rows]


def _node_column(reader: RunReader) -> str:
    cols = {r["name"] for r in reader.query("SELECT name FROM pragma_table_info('inventory_groups')")}
    return "coalesce(graph_nodes, 0)" if "graph_nodes" in cols else "0"


def _device_filter(metric: str) -> str:
    """The groups that live where the metric measures: CUDA tensors for CUDA allocated, the rest
    (CPU, or not recorded) for host RSS."""
    return "device LIKE 'cuda%'" if metric == "cuda_allocated" else "(device IS NULL OR device NOT LIKE 'cuda%')"


def _inventory_points(reader: RunReader, proc: int, metric: str, leaks: Sequence[Leak], limit: int,
                      origin: float | None) -> list[CategoryPoint]:
    if not has_inventories(reader):
        return []
    steps = _picked_inventories(reader, proc, limit)
    if not steps:
        return []
    cost = node_cost(reader, proc).bytes
    size = f"bytes + graph_bytes + {_node_column(reader)} * ?"
    parts: dict[int, dict[str, int]] = {s: dict.fromkeys(CATEGORIES, 0) for s in steps}
    for r in reader.query(f"SELECT step, category, sum({size}) AS b FROM inventory_groups WHERE proc = ?"
                          f" AND step IN (SELECT value FROM json_each(?)) AND {_device_filter(metric)}"
                          " GROUP BY step, category", (cost, proc, json.dumps(steps))):
        key = r["category"] if r["category"] in CATEGORIES else "other_tensors"
        parts[int(r["step"])][key] = parts[int(r["step"])].get(key, 0) + int(r["b"] or 0)
    for i, lk in enumerate(leaks):  # a leaking group: out of its category, a part of its own
        if not _on_metric_device(lk, metric):
            continue
        for step, b in _group_bytes(reader, proc, lk, steps, cost).items():
            p = parts[step]
            key = lk.category if lk.category in CATEGORIES else "other_tensors"
            taken = min(b, p.get(key, 0))
            p[key] = p.get(key, 0) - taken
            p[f"leak:{i}"] = taken
    ends = _step_ends(reader, proc, steps)
    out = []
    for step in steps:
        p = parts[step]
        loose = p.pop("other_tensors", 0)  # tensors of no known category: part of other
        end = ends.get(step)
        value = _metric_at(reader, proc, metric, end) if end is not None else None
        p["other"] = max(0, value - sum(p.values())) if value is not None else loose
        out.append(CategoryPoint(step, _since(end, origin), "end", value, p))
    return out


def _profiled_points(reader: RunReader, proc: int, metric: str, limit: int,
                     origin: float | None) -> list[CategoryPoint]:
    if not _has(reader, "step_breakdown"):
        return []
    peak_col = "peak_allocated" if metric == "cuda_allocated" else "peak_rss"
    rows = reader.query(
        f"SELECT b.step, b.parameters, b.gradients, b.optimizer_state, b.activations, s.end, s.{peak_col} AS peak"
        " FROM step_breakdown b LEFT JOIN steps s ON s.proc = b.proc AND s.step = b.step"
        " WHERE b.proc = ? ORDER BY b.step LIMIT ?", (proc, limit))
    out = []
    for r in rows:
        parts = {k: int(r[k] or 0) for k in CATEGORIES}
        peak = int(r["peak"]) if r["peak"] is not None else None
        parts["other"] = max(0, peak - sum(parts.values())) if peak is not None else 0
        out.append(CategoryPoint(int(r["step"]), _since(r["end"], origin), "peak", peak, parts))
    return out


def _on_metric_device(lk: Leak, metric: str) -> bool:
    device = lk.sig[3] if len(lk.sig) > 3 else None
    on_cuda = isinstance(device, str) and device.startswith("cuda")
    return on_cuda == (metric == "cuda_allocated")


def _group_bytes(reader: RunReader, proc: int, lk: Leak, steps: Sequence[int], cost: int) -> dict[int, int]:
    """The leak's group (its signature) at ``steps``: bytes as the verdict counts them."""
    if not lk.sig:
        return {}
    where = " AND ".join(f"{c} IS ?" for c in ("category", "dtype", "shape", "device", "requires_grad", "grad_fn"))
    rows = reader.query(f"SELECT step, sum(bytes + graph_bytes + {_node_column(reader)} * ?) AS b"
                        f" FROM inventory_groups WHERE proc = ? AND step IN (SELECT value FROM json_each(?))"
                        f" AND {where} GROUP BY step", (cost, proc, json.dumps(list(steps)), *lk.sig))
    return {int(r["step"]): int(r["b"] or 0) for r in rows}


def _step_ends(reader: RunReader, proc: int, steps: Sequence[int]) -> dict[int, float]:
    rows = reader.query("SELECT step, end FROM steps WHERE proc = ? AND step IN (SELECT value FROM json_each(?))",
                        (proc, json.dumps(list(steps))))
    return {int(r["step"]): float(r["end"]) for r in rows}


def _metric_at(reader: RunReader, proc: int, metric: str, t: float) -> int | None:
    """The metric's last sample at or before ``t`` (summed over devices on CUDA): one indexed
    look-up each."""
    if metric == "rss":
        v = reader.scalar("SELECT rss FROM samples WHERE proc = ? AND t <= ? ORDER BY t DESC LIMIT 1", (proc, t))
        return int(v) if v is not None else None
    total, seen = 0, False
    for r in reader.query("SELECT DISTINCT device FROM cuda_samples WHERE proc = ?", (proc,)):
        v = reader.scalar("SELECT allocated FROM cuda_samples WHERE proc = ? AND device = ? AND t <= ?"
                          " ORDER BY t DESC LIMIT 1", (proc, r["device"], t))
        if v is not None:
            total, seen = total + int(v), True
    return total if seen else None


def _since(t: Any, origin: float | None) -> float | None:
    if t is None:
        return None
    return float(t) - origin if origin is not None else float(t)


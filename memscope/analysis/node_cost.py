"""What one retained autograd node costs on this run, measured rather than assumed.

A graph-node leak (``total_loss += loss`` after ``backward()``) keeps C++ autograd nodes, not
tensors: the inventories count the nodes, and the agent reads the bytes glibc's malloc has handed
out (``inventories.heap``) at each. Over the later half of the run's inventories, the heap's
growth less the growth of host tensor bytes (CPU tensors live on the same heap), regressed on the
node count (the median of the pairwise slopes: a moment when another thread held more heap
moves it little), is the cost of a node on this run. Where that cannot be measured — no heap readings
(not glibc), too few nodes gained, host tensors growing as much as the nodes (each tensor also
costs heap beyond its bytes — its TensorImpl, malloc's rounding — which the slope would charge
to the nodes), or a slope no node can have (other allocations moved with them) — the estimate
``NODE_BYTES`` is used and the text says "estimated".

Measured against glibc's own count on a loop run without memscope
(``tests/scripts/graph_malloc.py``): 710 bytes a node for ``examples/leaks/total_loss.py``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from memscope.constants import NODE_BYTES, WARMUP_STEPS

if TYPE_CHECKING:
    from memscope.store.reader import RunReader

# nodes gained over the window: fewer, and the agent's own heap activity swamps them (on
# total_loss.py, 8-17% high at 30-40 steps on an idle machine and 26-41% on a loaded one; 2% at
# 1,000 steps, about 5,500 nodes in the window)
MIN_NODES = 1000
MIN_POINTS = 3
MAX_POINTS = 200
TENSOR_SHARE = 0.5  # host tensor growth above this share of the nodes' (at NODE_BYTES): not measured
PLAUSIBLE = (48, 16384)  # bytes a node: a node with no saved variables to one with many


@dataclass(frozen=True)
class NodeCost:
    bytes: int  # per retained autograd node
    measured: bool  # False: the estimate NODE_BYTES
    nodes: int = 0  # nodes gained over the window it was measured on

    def phrase(self) -> str:
        """For the leak texts: where the bytes of a graph leak come from."""
        if self.measured:
            return f"measured at {self.bytes} bytes a node on this run"
        return f"estimated at {self.bytes} bytes a node"


ESTIMATE = NodeCost(NODE_BYTES, False)

Point = tuple[int, int | None, int, int]  # step, heap bytes, graph nodes, host tensor bytes


def measure(points: Sequence[Point]) -> NodeCost:
    """The cost of a node from inventories ordered by step (after the warm-up): a least-squares
    slope of (heap - host tensor bytes) on graph nodes over the later half of the run."""
    pts = [p for p in points if p[1] is not None]
    if len(pts) < MIN_POINTS:
        return ESTIMATE
    mid = (pts[0][0] + pts[-1][0]) / 2
    late = [p for p in pts if p[0] >= mid]
    if len(late) < MIN_POINTS:
        late = pts[-MIN_POINTS:]
    xs = [float(p[2]) for p in late]
    ys = [float(p[1] or 0) - float(p[3]) for p in late]
    gained = xs[-1] - xs[0]
    if gained < MIN_NODES or late[-1][3] - late[0][3] > TENSOR_SHARE * gained * NODE_BYTES:
        return ESTIMATE
    if len(xs) > MAX_POINTS:  # pairwise slopes grow as n^2: an even spread of the points
        keep = [round(i * (len(xs) - 1) / (MAX_POINTS - 1)) for i in range(MAX_POINTS)]
        xs, ys = [xs[i] for i in keep], [ys[i] for i in keep]
    slopes = sorted((ys[j] - ys[i]) / (xs[j] - xs[i])
                    for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i])
    if not slopes:
        return ESTIMATE
    slope = statistics.median(slopes)
    if not PLAUSIBLE[0] <= slope <= PLAUSIBLE[1]:
        return ESTIMATE
    return NodeCost(int(round(slope)), True, int(gained))


def node_cost(reader: "RunReader", proc: int) -> NodeCost:
    """The run's cost of a node (or the estimate), from its inventories."""
    cols = {r["name"] for r in reader.query("SELECT name FROM pragma_table_info('inventories')")}
    if "heap" not in cols or "graph_nodes" not in cols:
        return ESTIMATE
    rows = reader.query(
        "SELECT i.step, i.heap, coalesce(i.graph_nodes, 0) AS nodes, "
        "  i.bytes + i.graph_bytes - coalesce((SELECT sum(g.bytes + g.graph_bytes) FROM inventory_groups g "
        "    WHERE g.proc = i.proc AND g.step = i.step AND g.device != 'cpu'), 0) AS host_tensor_bytes "
        "FROM inventories i WHERE i.proc = ? AND i.step >= ? ORDER BY i.step", (proc, WARMUP_STEPS))
    try:
        points = [(int(r["step"]), None if r["heap"] is None else int(r["heap"]),
                   int(r["nodes"]), int(r["host_tensor_bytes"])) for r in rows]
    except (TypeError, ValueError, OverflowError):  # a damaged file's text or infinity: no measure
        return ESTIMATE
    return measure(points)

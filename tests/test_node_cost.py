"""What a retained autograd node costs, measured on the run (analysis/node_cost.py): the slope of
heap bytes less host tensor bytes on the node count, over the later half of the inventories;
the estimate where that cannot be measured. Real runs: tests/test_leaks.py (40 steps) and
tests/test_leak_lengths.py (1,000 steps, within 5% of glibc's count without memscope)."""

from __future__ import annotations

from memscope.analysis.node_cost import ESTIMATE, MIN_NODES, measure
from memscope.constants import NODE_BYTES


def points(n: int, per_node: int, nodes_a_step: int = 60, tensor_a_step: int = 0,
           noise: list[int] | None = None) -> list[tuple[int, int | None, int, int]]:
    out = []
    for i in range(n):
        nodes = 100 + nodes_a_step * i
        tensors = 1_000_000 + tensor_a_step * i
        heap = 50_000_000 + tensors + per_node * nodes + (noise[i % len(noise)] if noise else 0)
        out.append((2 + i, heap, nodes, tensors))
    return out


def test_the_slope_of_heap_on_nodes_is_the_cost_of_a_node() -> None:
    cost = measure(points(40, 710))
    assert cost.measured and cost.bytes == 710 and cost.phrase() == "measured at 710 bytes a node on this run"


def test_host_tensor_growth_is_not_charged_to_the_nodes() -> None:
    # a few tensor bytes beside the node leak (the kept scalar losses): on the same heap
    assert measure(points(40, 710, tensor_a_step=4 * 60)).bytes == 710


def test_no_measure_where_tensors_grow_as_much_as_the_nodes() -> None:
    # a kept loss with its saved activations: each saved tensor's TensorImpl and malloc rounding
    # grow the heap too, and the slope would charge them to the nodes
    assert measure(points(40, 710, nodes_a_step=100, tensor_a_step=130_640)) == ESTIMATE
    assert measure(points(40, 710, nodes_a_step=100, tensor_a_step=30_000)).measured


def test_only_the_later_half_counts() -> None:
    # the first half's heap grows by an extra 5,000 bytes a step (the agent warming up)
    pts = points(40, 700)
    pts = [(s, (h or 0) + 5_000 * min(i, 20), n, t) for i, (s, h, n, t) in enumerate(pts)]
    assert measure(pts).bytes == 700


def test_noise_is_averaged_by_the_fit() -> None:
    cost = measure(points(200, 720, noise=[0, 3000, -2000, 500, -1500]))
    assert cost.measured and abs(cost.bytes - 720) <= 10


def test_a_moment_of_extra_heap_moves_the_slope_little() -> None:
    # another thread held 2 MB at three inventories (the writer's queue during a lock): a
    # least-squares fit would move by hundreds of bytes a node, the median of slopes does not
    pts = points(40, 720)
    pts = [(s, (h or 0) + (2_000_000 if i in (30, 35, 39) else 0), n, t) for i, (s, h, n, t) in enumerate(pts)]
    cost = measure(pts)
    assert cost.measured and abs(cost.bytes - 720) <= 15, cost


def test_too_few_nodes_or_no_heap_or_an_impossible_slope_give_the_estimate() -> None:
    few = points(8, 700, nodes_a_step=(MIN_NODES // 8) - 1)
    assert measure(few) == ESTIMATE
    assert measure([(s, None, n, t) for s, _, n, t in points(40, 700)]) == ESTIMATE
    assert measure(points(40, 100_000)) == ESTIMATE  # other allocations moved with the nodes
    assert measure(points(40, -50)) == ESTIMATE
    assert ESTIMATE.bytes == NODE_BYTES and not ESTIMATE.measured
    assert ESTIMATE.phrase() == f"estimated at {NODE_BYTES} bytes a node"

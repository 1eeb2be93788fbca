"""Independent truth for leak tests: what a script keeps alive per step, measured without memscope.

    python tests/leaktruth/truth.py OUT.json STEP_A STEP_B SCRIPT.py [ARGS...]

Runs SCRIPT as ``__main__`` (memscope is not imported) and, after optimizer steps STEP_A and
STEP_B (counted from 0 by a global optimizer step post hook), walks every object the garbage
collector tracks for tensors: per group (shape, dtype, grad_fn type) the tensors' count and
storage bytes (each storage once; a sparse tensor's indices and values), the autograd nodes
their graphs keep (each node once) and the bytes of the tensors those nodes still save
(unpacked through the public ``_saved_*`` attributes). Writes {"a": STEP_A, "b": STEP_B,
"groups": {"shape|dtype|grad_fn": [[count, bytes, nodes, saved_bytes] at A, [...] at B]}} to
OUT.json.

    python tests/leaktruth/truth.py --at OUT.json STEPS SCRIPT.py [ARGS...]

The walk after each of ``STEPS`` (``1-40,191``: steps 1 to 40 and 191): for a leak kept on some
steps only, whose rate is measured from its first occurrence (the first of these walks where
it grew) to a later step. Writes {"steps": [...], "groups": {"shape|dtype|grad_fn": [[count,
bytes, nodes, saved_bytes] after each step]}} to OUT.json.

    python tests/leaktruth/truth.py --many JOBS.json

The same for several scripts, one after the other in this one process (one interpreter and torch
start-up for all: tests/leak_lengths.py's cases): JOBS.json is a list of [OUT.json, STEP_A,
STEP_B, SCRIPT.py, [ARGS...]]. Each script runs in a fresh ``__main__`` with its own step count
and hook. What an earlier script left alive is alive at both of a later one's steps: the figures
per step are differences between the two walks, so it cancels. On tests/leak_lengths.py's 11 leak
cases: the bytes (a tensor's own plus what its graph saves) and the nodes per step are those of
one process per script, to the byte; where a storage is both a tensor's and saved by a graph, the
walk's order (the objects alive) decides which of the two columns counts it.
"""

from __future__ import annotations

import gc
import json
import runpy
import sys
from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook


def _saved(node: object) -> list[torch.Tensor]:
    out = []
    for name in dir(node):
        if name.startswith("_saved_"):
            try:
                v = getattr(node, name)
            except Exception:  # freed by backward
                continue
            for x in (v if isinstance(v, (tuple, list)) else (v,)):
                if isinstance(x, torch.Tensor):
                    out.append(x)
    return out


def storages(t: torch.Tensor) -> list[tuple[int, int]]:
    """(address, bytes) of the storages a tensor keeps: its own, or a sparse tensor's indices
    and values (COO: indices, values; CSR/CSC/BSR/BSC: compressed and plain indices, values)."""
    layout = t.layout
    if layout == torch.strided:
        parts = [t]
    elif layout == torch.sparse_coo:
        parts = [t._indices(), t._values()]
    elif layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = [t.crow_indices(), t.col_indices(), t.values()]
    elif layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = [t.ccol_indices(), t.row_indices(), t.values()]
    else:
        return []
    return [(p.untyped_storage().data_ptr(), p.untyped_storage().nbytes()) for p in parts]


def census() -> dict[str, list[int]]:
    seen_storage: set[int] = set()
    seen_node: set[int] = set()
    keep: list[object] = []  # node wrappers held while walking, so ids stay unique
    groups: dict[str, list[int]] = {}
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    params = {id(p) for o in tensors if isinstance(o, torch.nn.Parameter) for p in (o,)}
    for t in tensors:
        parts = [(p, n) for p, n in storages(t) if p and p not in seen_storage]
        if not parts:
            continue
        ptr = parts[0][0]
        seen_storage.update(p for p, _ in parts)
        fn = t.grad_fn
        key = f"{list(t.shape)}|{str(t.dtype).replace('torch.', '')}|{type(fn).__name__ if fn else None}"
        g = groups.setdefault(key, [0, 0, 0, 0])
        g[0] += 1
        g[1] += sum(n for _, n in parts)
        todo = [fn] if fn is not None and id(t) not in params else []
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen_node:
                continue
            seen_node.add(id(node))
            keep.append(node)
            g[2] += 1
            for s in _saved(node):
                p = s.untyped_storage().data_ptr()
                if p and p not in seen_storage and p != ptr:
                    seen_storage.add(p)
                    g[3] += s.untyped_storage().nbytes()
            todo.extend(n for n, _ in node.next_functions)
    keep.clear()
    tensors.clear()
    return groups


def _walk_after(steps: list[int], script: str, args: list[str],
                done: Callable[[dict[int, dict[str, list[int]]]], None]) -> None:
    """Run ``script`` with ``args`` as ``__main__``, walk after each optimizer step of ``steps``
    and hand the walks to ``done`` after the last one."""
    taken: dict[int, dict[str, list[int]]] = {}
    want = set(steps)
    count = [0]

    def hook(opt: object, args: object, kwargs: object) -> None:
        step = count[0]
        count[0] += 1
        if step in want and step not in taken:
            taken[step] = census()
            if len(taken) == len(want):
                done(taken)

    handle = register_optimizer_step_post_hook(hook)
    sys.argv = [script, *args]
    where = script.rsplit("/", 1)[0] if "/" in script else "."
    sys.path.insert(0, where)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        handle.remove()
        sys.path.remove(where)
        gc.collect()  # the script's own cycles (its functions and globals) before the next one


def _write(out: str, doc: dict[str, Any]) -> None:
    with open(out, "w") as f:
        json.dump(doc, f)


def measure(out: str, a: int, b: int, script: str, args: list[str]) -> None:
    """Run ``script`` with ``args`` as ``__main__`` and write the walks after optimizer steps
    ``a`` and ``b`` to ``out``."""
    def done(taken: dict[int, dict[str, list[int]]]) -> None:
        at_a, at_b = taken[a], taken[b]
        _write(out, {"a": a, "b": b, "groups": {k: [at_a.get(k, [0, 0, 0, 0]), at_b.get(k, [0, 0, 0, 0])]
                                                for k in set(at_a) | set(at_b)}})

    _walk_after([a, b], script, args, done)


def _steps(text: str) -> list[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def measure_at(out: str, steps: list[int], script: str, args: list[str]) -> None:
    """Run ``script`` with ``args`` as ``__main__`` and write the walk after each optimizer step
    of ``steps`` to ``out``."""
    def done(taken: dict[int, dict[str, list[int]]]) -> None:
        keys = set().union(*taken.values())
        _write(out, {"steps": steps, "groups": {k: [taken[s].get(k, [0, 0, 0, 0]) for s in steps] for k in keys}})

    _walk_after(steps, script, args, done)


def main() -> None:
    if sys.argv[1] == "--at":
        measure_at(sys.argv[2], _steps(sys.argv[3]), sys.argv[4], sys.argv[5:])
        return
    if sys.argv[1] == "--many":
        with open(sys.argv[2]) as f:
            jobs = json.load(f)
        for out, a, b, script, args in jobs:
            measure(out, int(a), int(b), script, list(args))
        return
    measure(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:])


if __name__ == "__main__":
    main()

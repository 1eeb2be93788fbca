"""An independent measure of what ``examples/leaks/total_loss.py``'s leak costs a step: the same
loop (its model, batch and ``total_loss += loss``) run without memscope, with glibc's own count
of the bytes malloc has handed out (``mallinfo2``) and a walk of the retained autograd graph.

    python tests/scripts/graph_malloc.py     # prints {"nodes_per_step": .., "bytes_per_step": ..}

Exits 2 where ``mallinfo2`` is missing (not glibc >= 2.33)."""

import ctypes
import gc
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "leaks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _common import batch, model_for  # noqa: E402


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]


def malloc_in_use() -> int:
    info = LIBC.mallinfo2()
    return int(info.uordblks + info.hblkhd)  # arena chunks in use + mmapped chunks


def graph_nodes(fn: object) -> int:
    seen, todo = set(), [fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        todo.extend(f for f, _ in node.next_functions)  # type: ignore[attr-defined]
    return len(seen)


try:
    LIBC = ctypes.CDLL("libc.so.6")
    LIBC.mallinfo2.restype = MallInfo2
except (OSError, AttributeError):
    print("no mallinfo2 here", file=sys.stderr)
    sys.exit(2)

torch.set_num_threads(1)
model = model_for(256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
total_loss = 0
marks = []
FROM, TO = 100, 400  # past warm-up (allocator caches, optimizer state); 300 steps measured
for step in range(TO):
    x, y = batch(32, 256)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    total_loss += loss  # the leak
    del x, y, loss
    if step + 1 in (FROM, TO):
        gc.collect()
        marks.append((malloc_in_use(), graph_nodes(total_loss.grad_fn)))
(b0, n0), (b1, n1) = marks
print(json.dumps({"nodes_per_step": (n1 - n0) / (TO - FROM), "bytes_per_step": (b1 - b0) / (TO - FROM)}))

"""whatif's live-tensor counter (TensorPeak) against the CPU allocator as torch.profiler sees it
(``profile_memory=True``: every allocation and free, with the allocator's running total).

    python tests/scripts/profiler_truth.py dense|sparse [--skip-sparse]

One training step of a small model (dense: an MLP with Adam; sparse: an ``nn.Embedding(sparse=True)``
with SGD, whose gradient is a sparse COO tensor), after two warm-up steps, all under the profiler
from before the model is built (so every free it sees is of a block whose size it knows). Prints
JSON: the counter's (start, peak) and the allocator's total at the step's start and its most during
the step. ``--skip-sparse`` counts as the counter did before sparse tensors were counted."""

import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function

from memscope.agent.collectors import tensor_peak as techniques
from memscope.agent.collectors.tensor_peak import TensorPeak

mode = sys.argv[1]
if "--skip-sparse" in sys.argv:
    real = techniques.storages
    techniques.storages = lambda t: [] if t.layout is not torch.strided else real(t)  # type: ignore[assignment]
torch.set_num_threads(1)
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    torch.manual_seed(0)
    if mode == "sparse":
        emb = nn.Embedding(5000, 64, sparse=True)
        model: nn.Module = nn.Sequential(emb, nn.Linear(64, 10))
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randint(0, 5000, (256,)), torch.randint(0, 10, (256,))
    else:
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(256, 64), torch.randint(0, 10, (256,))

    def step() -> None:
        x, y = batch()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    counter = TensorPeak()
    counter.begin(0)
    with record_function("STEP"):
        step()
    peak, start = counter.end()

events: list = []
todo = list(prof.profiler.kineto_results.experimental_event_tree())
while todo:
    e = todo.pop()
    events.append(e)
    todo.extend(e.children)
(window,) = [e for e in events if e.name == "STEP"]
allocs = sorted((e for e in events if e.typed[0] == _EventType.Allocation), key=lambda e: e.start_time_ns)
before = [e.typed[1].total_allocated for e in allocs if e.start_time_ns < window.start_time_ns]
during = [e.typed[1].total_allocated for e in allocs
          if window.start_time_ns <= e.start_time_ns <= window.end_time_ns]
print(json.dumps({"counter": [start, peak], "allocator": [before[-1], max(during)],
                  "uncounted": counter.uncounted}))

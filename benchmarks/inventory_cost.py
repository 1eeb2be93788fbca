"""Cost of one tensor inventory (leak detection), and of one step with creation-site capture armed.

Inventory: a small model with an Adam optimizer (parameters, gradients, state) plus N live
tensors — half plain (``other``), half holding an autograd graph of one op (``activations``,
their graphs are walked) — and optionally a dataset of M Python objects (``--objects``, one
small list each: what a tokenized corpus held in Python looks like to the gc). The registry of
live tensors starts before the tensors and the dataset exist (as under ``memscope attach``,
where the agent starts with ``import torch``); then ``take_inventory`` is timed ``--repeats``
times on this thread (the training thread pays exactly that at an inventory step). Printed: the
median per inventory, per 1k live tensors, and the cost of a full walk over every object (what
an inventory cost before the registry, and what one costs when the registry must start over).

Site capture: the median time of a small training step (forward, backward, SGD step, an append
to a list) plain and while ``SiteCapture`` is armed for a signature (TorchFunctionMode, global
forward hooks, line tracer) — the extra cost a run pays on the two or three steps after a group
becomes a leak suspect.

    .venv/bin/python benchmarks/inventory_cost.py                 # 1k, 100k tensors; 1k + 5M objects
    .venv/bin/python benchmarks/inventory_cost.py --quick         # smoke test
    .venv/bin/python benchmarks/inventory_cost.py --cases 1000:0 100000:0 --repeats 5 --json out.json
    .venv/bin/python benchmarks/inventory_cost.py --cases 1000:200000:off   # a script's gc.disable()
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from memscope.agent.collectors.inventory import LiveTensors, signature, take_inventory  # noqa: E402
from memscope.agent.collectors.leak_sites import SiteCapture  # noqa: E402


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 256)).sum().backward()
    opt.step()  # lazy Adam state exists
    return model, opt


def inventory_cost(n: int, objects: int, repeats: int, gc_off: bool = False) -> dict[str, float]:
    live = LiveTensors()
    live.install()
    if gc_off:  # as a script that calls gc.disable(): the young generation holds all made since
        gc.disable()
    model, opt = model_and_optimizer()
    w = torch.randn(4, requires_grad=True)
    tensors = [torch.randn(4) for _ in range(n // 2)] + [w * float(i) for i in range(n - n // 2)]
    dataset = [[i] for i in range(objects)]
    if not gc_off:
        gc.collect()
    times = []
    counted = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        inv = take_inventory(live, [opt])
        times.append(time.perf_counter() - t0)
        counted = inv.tensors
    t0 = time.perf_counter()
    take_inventory(None, [opt])  # a fresh registry: one walk over every object
    full = time.perf_counter() - t0
    live.remove()
    gc.enable()
    med = statistics.median(times)
    del tensors, dataset, model, opt
    gc.collect()
    return {"live_tensors": n, "python_objects": objects, "gc_off": gc_off, "counted": counted, "seconds": med,
            "seconds_per_1k": med / (max(n, 1) / 1000), "full_walk_seconds": full}


def step_cost(steps: int, armed: bool) -> float:
    model, _ = model_and_optimizer()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept: list[torch.Tensor] = []
    cap = SiteCapture()
    times = []
    for i in range(steps):
        if armed:
            cap.disarm()
            cap.arm({signature("other", torch.zeros(32, 256))})
        t0 = time.perf_counter()
        x = torch.randn(32, 256)
        loss = F.cross_entropy(model(x), torch.randint(0, 10, (32,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        kept.append(x.detach())
        times.append(time.perf_counter() - t0)
        if armed:
            cap.boundary()
    cap.disarm(pending=True)
    return statistics.median(times[2:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=["1000:0", "100000:0", "1000:5000000"],
                   metavar="TENSORS:OBJECTS[:off]",
                   help="live tensors and Python objects per case; ':off' with the collector disabled "
                        "(the objects stay in the young generation: the median is the inventories "
                        "after the first, which look past their mark)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--quick", action="store_true", help="small cases, few repeats (smoke test)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    if args.quick:
        args.cases, args.repeats, args.steps = ["1000:0", "2000:100000"], 2, 8
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load {os.getloadavg()[0]:.1f}")
    out: dict[str, object] = {"inventory": []}
    for case in args.cases:
        n, objects, *off = case.split(":")
        r = inventory_cost(int(n), int(objects), args.repeats, gc_off=off == ["off"])
        out["inventory"].append(r)  # type: ignore[union-attr]
        print(f"inventory  {n:>7} live tensors, {objects:>8} Python objects{' (gc off)' if off else ''} "
              f"(counted {r['counted']}): "
              f"{r['seconds'] * 1000:8.1f} ms   {r['seconds_per_1k'] * 1000:6.2f} ms per 1k tensors"
              f"   (a full walk: {r['full_walk_seconds'] * 1000:.1f} ms)")
    plain = step_cost(args.steps, armed=False)
    armed = step_cost(args.steps, armed=True)
    out["site_capture"] = {"plain_step_s": plain, "armed_step_s": armed, "ratio": armed / plain}
    print(f"site capture: step {plain * 1000:.2f} ms plain, {armed * 1000:.2f} ms armed "
          f"({armed / plain:.2f}x, on the 2-3 steps after a group becomes a suspect)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cost of one tensor inventory (leak detection) at 10k and 100k live tensors, and of one step
with creation-site capture armed.

Inventory: a small model with an Adam optimizer (parameters, gradients, state) plus N live
tensors — half plain (``other``), half holding an autograd graph of one op (``activations``,
their graphs are walked) — then ``InventoryCollector.take`` timed ``--repeats`` times on this
thread (the training thread pays exactly that at an inventory step). Prints the median seconds
per inventory and per 1k live tensors.

Site capture: the median time of a small training step (forward, backward, SGD step, an append
to a list) plain and while ``SiteCapture`` is armed for a signature (TorchFunctionMode, global
forward hooks, line tracer) — the extra cost a run pays on the two or three steps after a group
becomes a leak suspect.

    .venv/bin/python benchmarks/inventory_cost.py
    .venv/bin/python benchmarks/inventory_cost.py --sizes 10000 100000 --repeats 5 --json out.json
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

from memscope.agent.inventory import InventoryCollector, signature  # noqa: E402
from memscope.agent.leak_sites import SiteCapture  # noqa: E402


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 256)).sum().backward()
    opt.step()  # lazy Adam state exists
    return model, opt


def inventory_cost(n: int, repeats: int) -> dict[str, float]:
    model, opt = model_and_optimizer()
    w = torch.randn(4, requires_grad=True)
    live = [torch.randn(4) for _ in range(n // 2)] + [w * float(i) for i in range(n - n // 2)]
    gc.collect()
    coll = InventoryCollector(every=1)
    times = []
    counted = 0
    for i in range(repeats):
        t0 = time.perf_counter()
        inv = coll.take(i, [opt])
        times.append(time.perf_counter() - t0)
        counted = inv.tensors
    med = statistics.median(times)
    del live, model, opt
    return {"live_tensors": n, "counted": counted, "seconds": med, "seconds_per_1k": med / (n / 1000)}


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
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load {os.getloadavg()[0]:.1f}")
    out: dict[str, object] = {"inventory": []}
    for n in args.sizes:
        r = inventory_cost(n, args.repeats)
        out["inventory"].append(r)  # type: ignore[union-attr]
        print(f"inventory  {n:>7} live tensors (counted {r['counted']}): {r['seconds'] * 1000:8.1f} ms"
              f"   {r['seconds_per_1k'] * 1000:6.2f} ms per 1k tensors")
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

"""``memscope estimate`` of a 7B-parameter GPT on this machine: time and memory.

The model is examples/tiny_gpt.py at the LLaMA-7B shape (32 layers, 4096 wide, 32 heads, a
32,000-token vocabulary; a GELU MLP of 4 x 4096, so 6.7B parameters), batch 1, 4,096 tokens,
AdamW in fp32: 108 GB of model states before a single activation, which no laptop holds. The
estimate runs it under FakeTensorMode (two training steps) and must take at most 60 s and 4 GB
of RAM.

    .venv/bin/python benchmarks/estimate_7b.py             # the 7B configuration
    .venv/bin/python benchmarks/estimate_7b.py --quick     # a 2-layer, 1024-wide smoke test

Prints the wall time of the whole ``memscope estimate`` command (start-up, importing torch,
the fake run), the largest resident set of any of its processes (the fake run's child, the
server it forks from, the CLI), and the estimate; exits 1 past either limit. Run it alone on
the machine: other load stretches the time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = ["--layers", "32", "--d-model", "4096", "--heads", "32", "--vocab", "32000",
         "--seq", "4096", "--batch", "1"]
QUICK = ["--layers", "2", "--d-model", "1024", "--heads", "8", "--vocab", "32000",
         "--seq", "1024", "--batch", "1"]
LIMIT_S, LIMIT_RSS = 60.0, 4 * 10**9


def human(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small shape, to check the script runs")
    args = p.parse_args()
    shape = QUICK if args.quick else SHAPE
    cmd = [sys.executable, "-m", "memscope", "estimate", "--json", str(ROOT / "examples" / "tiny_gpt.py"),
           "--eval-every", "0", *shape]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    children_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if out.returncode != 0:
        print(out.stderr.strip(), file=sys.stderr)
        return 1
    est = json.loads(out.stdout)
    params = est["parameters"] // 4
    print(f"config     tiny_gpt {' '.join(shape)} (fp32, AdamW, 2 steps)")
    print(f"machine    {os.cpu_count()} cores, load average {load:.2f} at the start")
    print(f"parameters {params / 1e9:.2f}B ({human(est['parameters'])})")
    for k in ("gradients", "optimizer_state", "activations", "tensor_peak", "allocator_peak", "device_total"):
        print(f"{k:<16}{human(est[k]):>12}")
    print(f"wall time  {wall:.1f} s (limit {LIMIT_S:.0f} s)")
    print(f"peak RSS   {human(children_rss)} (largest process of the command; limit {LIMIT_RSS / 1e9:.0f} GB)")
    if args.quick:
        return 0
    return 0 if wall <= LIMIT_S and children_rss <= LIMIT_RSS else 1


if __name__ == "__main__":
    sys.exit(main())

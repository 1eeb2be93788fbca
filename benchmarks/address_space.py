"""Address space of an attached training vs plain (issue #21): VmPeak / VmSize, and the delta.

    .venv/bin/python benchmarks/address_space.py [--steps 20]

Runs examples/tiny_gpt.py through tests/scripts/vm_probe.py (which writes the process's VmPeak
and VmSize from /proc/self/status at the end), once plain and once under ``memscope attach
--headless``, with OMP_NUM_THREADS=1 so torch's own thread count is the same in both. The
overhead is address space reserved, not memory used: thread stacks and glibc's malloc arena of
each thread memscope starts (64 MiB each), plus sqlite3 and psutil. It matters under
``ulimit -v`` (RLIMIT_AS), which counts reservations. Linux only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "scripts" / "vm_probe.py"
SCRIPT = ROOT / "examples" / "tiny_gpt.py"


def measure(args: list[str], out: Path) -> dict[str, int]:
    env = dict(os.environ, OMP_NUM_THREADS="1", VM_PROBE_OUT=str(out))
    subprocess.run([sys.executable, *args], cwd=ROOT, env=env, check=True, capture_output=True)
    return {k: int(v) * 1024 for k, v in (item.split("=") for item in out.read_text().split())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    script = [str(PROBE), str(SCRIPT), "--steps", str(a.steps)]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        plain = measure(script, d / "plain.txt")
        attached = measure(["-m", "memscope", "attach", "--headless", "--db", str(d / "run.db"), *script],
                           d / "attached.txt")
    mb = 2**20
    print(f"tiny_gpt {a.steps} steps   {'plain':>10} {'attached':>10} {'delta':>10}")
    for key in ("VmPeak", "VmSize"):
        print(f"{key:<20} {plain[key] / mb:7.1f}MiB {attached[key] / mb:7.1f}MiB "
              f"{(attached[key] - plain[key]) / mb:+7.1f}MiB")


if __name__ == "__main__":
    main()

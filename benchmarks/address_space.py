"""Address space of an attached training vs plain (issue #21): VmPeak / VmSize, and the delta.

    .venv/bin/python benchmarks/address_space.py [--steps 20] [--scan LOW HIGH STEP]

Runs examples/tiny_gpt.py through tests/scripts/vm_probe.py (which writes the process's VmPeak
and VmSize from /proc/self/status at the end), once plain and once under ``memscope attach
--headless``, with OMP_NUM_THREADS=1 so torch's own thread count is the same in both. The
overhead is address space reserved, not memory used: thread stacks and glibc's malloc arena of
each thread memscope starts (64 MiB each; it starts one), plus sqlite3 and psutil. It matters
under ``ulimit -v`` (RLIMIT_AS), which counts reservations. Linux only.

``--scan LOW HIGH STEP`` (MiB) runs both under each ``ulimit -v`` from LOW to HIGH and says which
trained to the end (exit 0 and, attached, every step in the run file). Not monotonic: just above
what plain needs, glibc cannot reserve the arena of memscope's thread and that thread takes its
memory from the existing ones, so an attached run passes there and fails a little higher.
"""

from __future__ import annotations

import argparse
import os
import resource
import sqlite3
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


def trains_under(args: list[str], limit: int, steps: int, db: Path | None) -> bool:
    """Whether the run ends well with RLIMIT_AS at ``limit`` bytes (attached: every step kept)."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, OMP_NUM_THREADS="1", VM_PROBE_OUT=str(Path(tmp) / "vm.txt"))
        done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                              preexec_fn=cap, timeout=600)
        if done.returncode != 0:
            return False
    if db is None:
        return True
    conn = sqlite3.connect(db)
    try:
        return bool(conn.execute("SELECT count(*) FROM steps").fetchone()[0] == steps)
    finally:
        conn.close()


def scan(script: list[str], steps: int, low: int, high: int, step: int) -> None:
    print(f"ulimit -v   plain   attached   (tiny_gpt {steps} steps)")
    for mib in range(low, high + 1, step):
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "run.db"
            attach = ["-m", "memscope", "attach", "--headless", "--db", str(db), *script]
            plain = trains_under(script, mib << 20, steps, None)
            attached = trains_under(attach, mib << 20, steps, db)
        print(f"{mib:5d} MiB   {'ok' if plain else 'fail':>5}   {'ok' if attached else 'fail':>8}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--scan", type=int, nargs=3, metavar=("LOW", "HIGH", "STEP"),
                   help="ulimit -v values to try, in MiB")
    a = p.parse_args()
    script = [str(PROBE), str(SCRIPT), "--steps", str(a.steps)]
    if a.scan:
        scan(script, a.steps, *a.scan)
        return
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

"""What ``memscope daemon`` costs: its CPU per watched process per sample.

For each count N in ``--counts`` (default 0, 4, 16), N idle torch processes are started
(tests/scripts/node_proc.py --mode idle, each tagged), then a real ``memscope daemon --interval
--window 600 --match TAG --db TMP/node.db`` runs for ``--seconds``; its CPU time (user + system,
from /proc/PID/stat, read before it is stopped) and the samples it wrote are taken. Discovery
lists every process of the host whatever ``--match`` says (it must look at them all to find the
torch ones), so N = 0 is the fixed cost of one sample; the cost of a watched process is the
difference, divided by N:

    per process per sample = (cpu(N) / samples(N) - cpu(0) / samples(0)) / N

Printed, never asserted. Also printed: the daemon's resident memory at its end, and the node
file's size. The daemon's own start (imports) is excluded: CPU is read at the first sample and
at the end.

    .venv/bin/python benchmarks/node_daemon.py                       # ~2 minutes on 2 cores
    .venv/bin/python benchmarks/node_daemon.py --counts 0 2 --seconds 10   # a smoke test

Run it alone on the machine: other load changes the per-sample cost.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROC = ROOT / "tests" / "scripts" / "node_proc.py"
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().decode().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _samples(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return int(conn.execute("SELECT count(DISTINCT t) FROM samples").fetchone()[0] or 0)
    finally:
        conn.close()


def measure(n: int, seconds: float, interval: float, tmp: Path) -> dict[str, float]:
    tag = f"bench-{os.getpid()}-{n}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(PROC), "--mode", "idle", "--tag", tag, "--seconds", "900"],
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(n)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        db = tmp / f"node-{n}.db"
        daemon = subprocess.Popen([sys.executable, "-m", "memscope", "daemon", "--db", str(db), "--interval",
                                   str(interval), "--window", "600", "--match", tag], cwd=ROOT, env=env,
                                  stderr=subprocess.DEVNULL)
        while not db.exists() or (n and _samples(db) < 1) or (not n and db.stat().st_size == 0):
            time.sleep(0.05)
        cpu0, t0 = _cpu_s(daemon.pid), time.monotonic()
        first = _samples(db) if n else 0
        time.sleep(seconds)
        cpu1, t1 = _cpu_s(daemon.pid), time.monotonic()
        rss = _rss(daemon.pid)
        daemon.terminate()
        daemon.wait(timeout=60)
        samples = (_samples(db) - first) if n else max(int((t1 - t0) / interval), 1)
        return {"n": n, "cpu_s": cpu1 - cpu0, "samples": max(samples, 1), "rss": rss, "size": db.stat().st_size}
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--counts", type=int, nargs="+", default=[0, 4, 16])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=0.5)
    a = ap.parse_args()
    counts = sorted(set(a.counts) | {0})
    with tempfile.TemporaryDirectory(prefix="memscope-bench-node-") as tmp:
        rows = [measure(n, a.seconds, a.interval, Path(tmp)) for n in counts]
    base = rows[0]["cpu_s"] / rows[0]["samples"]
    print(f"memscope daemon --interval {a.interval:g}, {a.seconds:g} s each; {len(os.listdir('/proc'))} /proc "
          "entries on this host")
    print(f"{'watched':>8} {'samples':>8} {'CPU ms/sample':>14} {'per process ms':>15} {'daemon RSS':>11} "
          f"{'node file':>10}")
    for r in rows:
        per_sample = r["cpu_s"] / r["samples"]
        per_proc = (per_sample - base) / r["n"] if r["n"] else float("nan")
        print(f"{r['n']:>8} {r['samples']:>8} {per_sample * 1000:>14.2f} {per_proc * 1000:>15.3f} "
              f"{r['rss'] / 2**20:>9.1f} MiB {r['size'] / 1024:>7.0f} KiB")
    print("per process: (CPU per sample - CPU per sample watching none) / processes watched")


if __name__ == "__main__":
    main()

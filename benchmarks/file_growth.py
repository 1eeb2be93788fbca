"""Run-file growth per hour of training, at tiny and at real step times.

Runs real attached trainings (``memscope attach --headless``) of a small CPU model for a fixed
wall time and prints the run file's size, its bytes per table (SQLite's ``dbstat``), the size extrapolated
to one hour (bytes / training seconds * 3600) and the rate of the run's second half (rows made
after its midpoint times bytes per row: what an hour-long run adds once its start is behind it).
Arms:

* tiny:   a Linear(16, 16) SGD step, about 0.4 ms (thousands of steps a second)
* 20ms:   an MLP step padded with a sleep to about 20 ms (50 steps a second)

each at defaults and at full detail (``--layers-every 1 --inventory-every 1``; skip with
``--no-full``). The rate extrapolated from a short run overstates an hour's at defaults: the first
steps are kept whole and inventories thin out as the run goes.

    .venv/bin/python benchmarks/file_growth.py                 # 60 s per arm
    .venv/bin/python benchmarks/file_growth.py --seconds 20 --no-full
    MEMSCOPE_FOLD_AFTER_S=1e9 .venv/bin/python benchmarks/file_growth.py   # folding off: before
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = '''
import sys, time
import torch
import torch.nn as nn
torch.manual_seed(0)
seconds, kind = float(sys.argv[1]), sys.argv[2]
width = 16 if kind == "tiny" else 256
model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(32, width)
pad = 0.0 if kind == "tiny" else 0.020
t0 = time.perf_counter()
steps = 0
while time.perf_counter() - t0 < seconds:
    s = time.perf_counter()
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
    steps += 1
    if pad:
        time.sleep(max(0.0, pad - (time.perf_counter() - s)))
print(f"STEPS {steps} {time.perf_counter() - t0:.3f}")
'''

FULL = ["--layers-every", "1", "--inventory-every", "1"]


def table_bytes(db: str) -> dict[str, int]:
    """Bytes per table (indexes counted with their table) from SQLite's dbstat."""
    conn = sqlite3.connect(db)
    try:
        owner = {r[0]: r[1] for r in conn.execute("SELECT name, tbl_name FROM sqlite_master")}
        out: dict[str, int] = {}
        for name, size in conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"):
            key = owner.get(name, name)
            out[key] = out.get(key, 0) + int(size)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))
    except sqlite3.Error:
        return {}
    finally:
        conn.close()


_TIMED = {"samples": "t", "cuda_samples": "t", "nvml_samples": "t", "worker_samples": "t",
          "events": "t", "steps": "start", "step_windows": "start"}
_BY_STEP = ("layer_stats", "step_breakdown", "inventories", "inventory_groups", "leak_holders")


def steady_rate(db: str, tables: dict[str, int]) -> float | None:
    """MB per hour of the run's second half: rows made after its midpoint (by time, or by step
    for the per-step tables) times each table's bytes per row. Leaves out what a run writes once
    at its start (the first steps kept whole, the first inventories, the schema)."""
    conn = sqlite3.connect(db)
    try:
        lo, hi = conn.execute("SELECT min(t), max(t) FROM samples").fetchone()
        if lo is None or hi <= lo:
            return None
        mid = (lo + hi) / 2
        firsts = [conn.execute("SELECT min(step) FROM steps WHERE start >= ?", (mid,)).fetchone()[0]]
        try:
            firsts.append(conn.execute("SELECT min(first_step) FROM step_windows WHERE start >= ?",
                                       (mid,)).fetchone()[0])
        except sqlite3.Error:
            pass
        step_mid = min(x for x in firsts if x is not None)
        total = 0.0
        for table, size in tables.items():
            if table in _TIMED:
                where, arg = f"{_TIMED[table]} >= ?", mid
            elif table in _BY_STEP:
                where, arg = "step >= ?", step_mid
            else:
                continue
            rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            late = conn.execute(f"SELECT count(*) FROM {table} WHERE {where}", (arg,)).fetchone()[0]
            total += size / rows * late if rows else 0.0
        return total / (hi - mid) * 3600 / 1e6
    finally:
        conn.close()


def run_arm(kind: str, full: bool, seconds: float, work: Path) -> dict[str, Any]:
    script = work / "train.py"
    script.write_text(SCRIPT)
    db = work / f"{kind}-{'full' if full else 'default'}.db"
    cmd = [sys.executable, "-m", "memscope", "attach", "--headless", "--force", "--db", str(db),
           *(FULL if full else []), str(script), str(seconds), kind]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{kind} arm failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("STEPS "))
    steps, trained = int(line.split()[1]), float(line.split()[2])
    tables = table_bytes(str(db))
    size = db.stat().st_size + (os.path.getsize(f"{db}-wal") if os.path.exists(f"{db}-wal") else 0)
    report = json.loads(subprocess.run([sys.executable, "-m", "memscope", "report", "--json", str(db)],
                                       cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    conn = sqlite3.connect(db)
    try:
        kept = conn.execute("SELECT count(*) FROM steps").fetchone()[0]
        try:
            windows = conn.execute("SELECT count(*), coalesce(sum(steps), 0) FROM step_windows").fetchone()
        except sqlite3.Error:
            windows = (0, 0)
    finally:
        conn.close()
    return {"arm": f"{kind}/{'full' if full else 'default'}", "steps": steps, "seconds": trained,
            "report_steps": report["run"]["steps"], "kept_step_rows": kept,
            "windows": windows[0], "folded_steps": windows[1], "bytes": size,
            "mb_per_hour": size / trained * 3600 / 1e6, "steady_mb_per_hour": steady_rate(str(db), tables),
            "tables": tables}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="training wall time per arm")
    p.add_argument("--no-full", action="store_true", help="skip the full-detail arms")
    p.add_argument("--arms", default="tiny,20ms")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="memscope-growth-") as tmp:
        for kind in args.arms.split(","):
            for full in (False,) if args.no_full else (False, True):
                t = time.perf_counter()
                r = run_arm(kind, full, args.seconds, Path(tmp))
                results.append(r)
                top = ", ".join(f"{k} {v / 1e6:.2f}" for k, v in list(r["tables"].items())[:4])
                print(f"{r['arm']:14s} {r['steps']:>8d} steps in {r['seconds']:.0f} s "
                      f"(report says {r['report_steps']}; {r['kept_step_rows']} step rows kept, "
                      f"{r['folded_steps']} folded into {r['windows']} windows): "
                      f"{r['bytes'] / 1e6:.2f} MB, {r['mb_per_hour']:.1f} MB/h (second half: "
                      f"{r['steady_mb_per_hour'] or 0:.1f} MB/h)  [MB: {top}]  "
                      f"({time.perf_counter() - t:.0f} s)", flush=True)
                if r["report_steps"] != r["steps"]:
                    raise SystemExit(f"{r['arm']}: the report says {r['report_steps']} steps, "
                                     f"the script ran {r['steps']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

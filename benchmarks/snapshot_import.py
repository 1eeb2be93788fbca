"""How long ``memscope import`` takes on a big CUDA memory snapshot, how much memory it needs,
how large the run file is, and how fast the dashboard opens it.

    .venv/bin/python benchmarks/snapshot_import.py                    # 3,000,000 segments
    .venv/bin/python benchmarks/snapshot_import.py --segments 300000 --quick
    .venv/bin/python benchmarks/snapshot_import.py --segments 100000 --distinct   # a real snapshot's shape
    PYTHONPATH=/path/to/other/checkout .venv/bin/python benchmarks/snapshot_import.py  # compare

The snapshot: ``{"segments": [seg] * N, "device_traces": [trace]}`` with one realistic segment
(two blocks with frames; the layout of ``tests/data/make_snapshot.py``) referenced N times, and
a short trace ending in an ``oom`` entry. Pickled, each further reference costs two bytes: 3
million segments make a 6 MB file, the case of issue #14 (56 s, 1.3 GB, a 770 MB run file
before the importer aggregated). ``--distinct`` makes every segment (its blocks and frames) an
object of its own, as in a real snapshot, where memory and time follow the file's size. Built
deterministically in a temporary directory.

Printed, not asserted (one process at a time; the load average says how busy the machine was):
wall seconds and peak RSS of the ``memscope import`` process (``wait4``'s ``ru_maxrss``), the
pickle's and the run file's sizes and their ratio, and the dashboard's data load of the result
(:func:`memscope_tui.data.load_snapshot`, when installed).
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "data"))


def build(path: Path, segments: int, distinct: bool = False) -> None:
    import make_snapshot  # tests/data: the documented layout, built by hand

    snap = make_snapshot.snapshot()
    seg = snap["segments"][1]  # the 2 MiB small-pool segment, with blocks and frames
    trace = snap["device_traces"][0]
    if distinct:  # every segment, block and frame its own object, as in a real snapshot
        segs = [pickle.loads(pickle.dumps({**seg, "address": seg["address"] + i * 2 * make_snapshot.MiB,
                                           "frames": make_snapshot.frames(i % 997)}))
                for i in range(segments)]
    else:
        segs = [seg] * segments
    path.write_bytes(pickle.dumps({"segments": segs, "device_traces": [trace],
                                   "allocator_settings": snap["allocator_settings"]}, protocol=4))


def run_import(snapshot: Path, db: Path) -> tuple[float, int, int, str]:
    """(seconds, peak RSS bytes, exit status, stderr) of one ``memscope import``."""
    env = dict(os.environ)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "memscope", "import", str(snapshot), "--db", str(db),
                             "--force"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=db.parent)  # not the checkout: ``-m`` puts the cwd first on sys.path
    _pid, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    return seconds, int(usage.ru_maxrss) * 1024, proc.returncode, err.strip()


def dashboard_load(db: Path) -> float | None:
    """Seconds for the dashboard's data load of ``db`` (None when memscope_tui is missing)."""
    code = ("import sys, time; from memscope_tui.data import load_snapshot; t = time.perf_counter(); "
            "load_snapshot(sys.argv[1]); print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, cwd=db.parent)
    return float(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=3_000_000)
    ap.add_argument("--quick", action="store_true", help="one import, no dashboard load")
    ap.add_argument("--distinct", action="store_true",
                    help="distinct segment objects (a real snapshot's shape) instead of one shared")
    args = ap.parse_args()
    where = subprocess.run([sys.executable, "-c", "import memscope; print(memscope.__file__)"],
                           capture_output=True, text=True, cwd=tempfile.gettempdir()).stdout.strip()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus; memscope from {where}")
    with tempfile.TemporaryDirectory() as tmp:
        snap, db = Path(tmp) / "snap.pickle", Path(tmp) / "snap.db"
        build(snap, args.segments, args.distinct)
        size = snap.stat().st_size
        seconds, rss, code, err = run_import(snap, db)
        if code != 0:
            print(f"import failed (exit {code}): {err}")
            return 1
        out = db.stat().st_size
        kind = "distinct" if args.distinct else "shared"
        print(f"{args.segments:,} {kind} segments, pickle {size / 1e6:.1f} MB: import {seconds:.1f} s, "
              f"peak RSS {rss / 1e6:.0f} MB, run file {out / 1e6:.2f} MB ({out / size:.2f}x the pickle)")
        if not args.quick:
            load = dashboard_load(db)
            print("dashboard data load: " + (f"{load * 1000:.0f} ms" if load is not None
                                             else "memscope_tui not installed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How fast the dashboard opens a big run file, and what a live refresh costs.

    .venv/bin/python benchmarks/tui_open.py                      # 1,000,000 samples
    .venv/bin/python benchmarks/tui_open.py --samples 200000 --live-s 3

The run file: a copy of tests/tui/data/leaky.sqlite (a real example run: layers, inventories, a
leak) with host samples appended until it holds ``--samples`` rows, one step per 100 samples,
at 1 kHz. The content is deterministic. Printed (not asserted):

- ``load``: :func:`memscope_tui.data.load_head` (the overview's data, drawn first) and
  :func:`memscope_tui.data.load_snapshot` (all views' data, read after it), cold and warm;
- ``open``: from starting the app (headless, 80x24) to the first frame drawn and to every view
  loaded; and, when tmux is installed, ``memscope tui`` in a real terminal from the command to
  the timeline on screen;
- ``live``: while another process appends 1,000 samples/s, refreshes every 0.5 s: the head
  read's CPU (its thread's), wall time and new rows per refresh, the full reads done meanwhile,
  and the longest the UI's event loop went without running a 20 ms timer (what blocking would
  show as); then the same on a ``--small`` file, and the ratio of the two CPU medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "tests" / "tui" / "data" / "leaky.sqlite"
RATE_HZ = 1000.0
PER_STEP = 100


def build(path: Path, samples: int, base: Path = BASE) -> None:
    """Copy ``base`` and append host samples (and steps) until ``samples`` rows."""
    from memscope.store.writer import connect_rw

    shutil.copy(base, path)
    conn = connect_rw(str(path))
    proc, t0, have, step0 = conn.execute(
        "SELECT proc, max(t), count(*), max(step) FROM samples GROUP BY proc ORDER BY count(*) DESC"
    ).fetchone()
    step0 = int(conn.execute("SELECT coalesce(max(step), 0) FROM steps WHERE proc = ?", (proc,)).fetchone()[0]) + 1
    extra = max(0, samples - have)
    conn.execute("BEGIN")
    batch: list[tuple[int, float, int, str, int]] = []
    steps: list[tuple[int, int, float, float, int]] = []
    for i in range(extra):
        t = t0 + (i + 1) / RATE_HZ
        step = step0 + i // PER_STEP
        rss = 300_000_000 + (i % PER_STEP) * 400_000 + (i // 50_000) * 1_000_000  # sawtooth, slow growth
        batch.append((proc, t, step, "forward", rss))
        if i % PER_STEP == PER_STEP - 1:
            steps.append((proc, step, t - (PER_STEP - 1) / RATE_HZ, t, rss))
        if len(batch) >= 100_000:
            conn.executemany("INSERT INTO samples (proc, t, step, phase, rss) VALUES (?, ?, ?, ?, ?)", batch)
            batch.clear()
    conn.executemany("INSERT INTO samples (proc, t, step, phase, rss) VALUES (?, ?, ?, ?, ?)", batch)
    conn.executemany("INSERT INTO steps (proc, step, start, end, peak_rss) VALUES (?, ?, ?, ?, ?)", steps)
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def _median_time(fn: object, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def bench_load(db: Path) -> None:
    from memscope.analysis.run_head import RunHead
    from memscope.analysis.summary import summarize
    from memscope.analysis.timeline import memory_timeline
    from memscope.store.reader import RunReader
    from memscope_tui.data import load_head, load_snapshot

    began, cpu = time.perf_counter(), time.process_time()
    head = load_head(str(db), RunHead())
    print(f"head     cold {(time.perf_counter() - began) * 1000:7.0f} ms   CPU "
          f"{(time.process_time() - cpu) * 1000:.0f} ms   warm "
          f"{_median_time(lambda: load_head(str(db), RunHead())) * 1000:7.0f} ms   "
          f"({head.rows_read} rows aggregated)")
    began, cpu = time.perf_counter(), time.process_time()
    snap = load_snapshot(str(db))
    cold, cpu = time.perf_counter() - began, time.process_time() - cpu
    warm = _median_time(lambda: load_snapshot(str(db)))
    print(f"full     cold {cold * 1000:7.0f} ms   warm {warm * 1000:7.0f} ms   "
          f"CPU {cpu * 1000:.0f} ms over its threads   "
          f"({snap.summary.samples} samples, {snap.summary.steps} steps)")
    with RunReader(db) as reader:
        print(f"  summarize        {_median_time(lambda: summarize(reader)) * 1000:7.0f} ms")
        print(f"  memory_timeline  {_median_time(lambda: memory_timeline(reader, 200)) * 1000:7.0f} ms")


async def _open(db: Path) -> tuple[float, float, float]:
    """Seconds from the app's start to its first frame and to every view loaded; the first
    head read's own time."""
    from memscope_tui.app import MemscopeApp

    began = time.perf_counter()
    app = MemscopeApp(str(db))
    async with app.run_test(size=(80, 24)):
        while app.paints < 1:
            await asyncio.sleep(0.005)
        drawn = time.perf_counter() - began
        assert app.snapshot is not None
        read = app.snapshot.read_s
        while app.loads < 1:
            await asyncio.sleep(0.005)
        return drawn, time.perf_counter() - began, read


def _writer(path: str, seconds: float) -> None:
    """Append samples at 1 kHz in 50 ms transactions, as the agent's writer thread does."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=5)
    conn.execute("PRAGMA journal_mode=WAL")
    proc, t, step = conn.execute("SELECT proc, max(t), max(step) FROM samples GROUP BY proc "
                                 "ORDER BY count(*) DESC").fetchone()
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        rows = []
        for _ in range(50):
            i += 1
            rows.append((proc, t + i / RATE_HZ, step + i // PER_STEP, "backward", 320_000_000 + i))
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO samples (proc, t, step, phase, rss) VALUES (?, ?, ?, ?, ?)", rows)
        conn.execute("UPDATE processes SET heartbeat = ? WHERE id = ?", (time.time(), proc))
        conn.execute("COMMIT")
        time.sleep(0.05)
    conn.close()


async def _live(db: Path, seconds: float) -> dict[str, float]:
    """Refreshes while another process appends: per head read its thread's CPU, wall time and the
    rows it covered; full reads (the slow analyses) done meanwhile; the longest UI stall."""
    from memscope_tui.app import MemscopeApp

    conn = sqlite3.connect(db, isolation_level=None)
    # a live run whose writer is the --write process: no pid to look up, so readers judge it by
    # the heartbeat that process stamps (memscope/store/liveness.py)
    conn.execute("UPDATE run SET status = 'running', ended = NULL, exit_code = NULL, owner_pid = NULL")
    conn.execute("UPDATE processes SET status = 'finished', heartbeat = ?", (time.time(),))
    conn.close()
    app = MemscopeApp(str(db))
    cpu: list[float] = []
    reads: list[float] = []
    rows: list[int] = []
    gaps: list[float] = []
    async with app.run_test(size=(80, 24)):
        while app.full_reads < 1:  # the open's full read done: measure the steady state
            await asyncio.sleep(0.01)
        writer = subprocess.Popen([sys.executable, __file__, "--write", str(db), str(seconds + 1)])
        last = time.perf_counter()
        seen, fulls = app.head, app.full_reads
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            await asyncio.sleep(0.02)  # runs on the UI's event loop: late wake-ups = a blocked UI
            now = time.perf_counter()
            gaps.append(now - last - 0.02)
            last = now
            head = app.head
            if head is not seen and head is not None:
                seen = head
                cpu.append(head.cpu_s)
                reads.append(head.read_s)
                rows.append(head.rows_read)
        fulls = app.full_reads - fulls
    writer.wait()
    if not cpu:
        return {}
    return {"refreshes": len(cpu), "cpu_ms": statistics.median(cpu) * 1000, "cpu_max_ms": max(cpu) * 1000,
            "wall_ms": statistics.median(reads) * 1000, "rows": statistics.median(rows),
            "fulls": fulls, "stall_ms": max(gaps) * 1000 if gaps else 0.0}


def _print_live(label: str, live: dict[str, float], seconds: float) -> None:
    print(f"live {label:>9}  {live['refreshes']:.0f} refreshes in {seconds:g} s; head read per refresh: "
          f"CPU median {live['cpu_ms']:.1f} ms (max {live['cpu_max_ms']:.1f}), wall {live['wall_ms']:.0f} ms, "
          f"{live['rows']:.0f} new rows; full reads meanwhile {live['fulls']:.0f}; "
          f"longest UI stall {live['stall_ms']:.0f} ms")


def _terminal_open(db: Path) -> float | None:
    """``memscope tui DB`` in a real terminal (tmux, 80x24): seconds from the command starting to
    the timeline on screen (python start-up and imports included). None without tmux."""
    tmux = shutil.which("tmux")
    if tmux is None:
        return None
    sock = f"memscope-bench-{os.getpid()}"
    cmd = f"{sys.executable} -m memscope tui {db}; sleep 60"
    began = time.perf_counter()
    subprocess.run([tmux, "-L", sock, "new-session", "-d", "-x", "80", "-y", "24", cmd], check=True)
    try:
        while time.perf_counter() - began < 30:
            screen = subprocess.run([tmux, "-L", sock, "capture-pane", "-p"], capture_output=True,
                                    text=True).stdout
            if "host RSS ·" in screen:
                return time.perf_counter() - began
            time.sleep(0.01)
        return None
    finally:
        subprocess.run([tmux, "-L", sock, "kill-server"], capture_output=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--live-s", type=float, default=5.0, help="seconds of live refresh to measure")
    p.add_argument("--small", type=int, default=10_000,
                   help="also measure live refresh on a file of this many samples (0: not)")
    p.add_argument("--keep", metavar="PATH", help="keep the generated run file here")
    p.add_argument("--write", nargs=2, metavar=("DB", "SECONDS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.write:  # the live writer, in its own process
        _writer(args.write[0], float(args.write[1]))
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(args.keep) if args.keep else Path(tmp) / "big.db"
        began = time.perf_counter()
        build(db, args.samples)
        print(f"built {db} ({db.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - began:.1f} s; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        bench_load(db)
        drawn, full, read = asyncio.run(_open(db))
        print(f"open     first frame drawn {drawn * 1000:.0f} ms after the app started (its head read "
              f"{read * 1000:.0f} ms); every view loaded at {full * 1000:.0f} ms")
        term = _terminal_open(db)
        if term is not None:
            print(f"terminal `memscope tui` in tmux: timeline on screen {term * 1000:.0f} ms after "
                  "the command started (python start-up included)")
        live = asyncio.run(_live(db, args.live_s))
        if not live:
            print("live     no refresh happened", file=sys.stderr)
            return 1
        _print_live(f"{args.samples:,}", live, args.live_s)
        if args.small > 0:  # the same at a small run length: the refresh must not grow with it
            small = Path(tmp) / "small.db"
            build(small, args.small)
            few = asyncio.run(_live(small, args.live_s))
            if not few:
                print("live     no refresh happened on the small file", file=sys.stderr)
                return 1
            _print_live(f"{args.small:,}", few, args.live_s)
            print(f"live     head read CPU ratio {args.samples:,} / {args.small:,} samples: "
                  f"{live['cpu_ms'] / max(few['cpu_ms'], 1e-6):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

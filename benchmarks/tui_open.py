"""How fast the dashboard opens a big run file, and what a live refresh costs.

    .venv/bin/python benchmarks/tui_open.py                      # 1,000,000 samples
    .venv/bin/python benchmarks/tui_open.py --samples 200000 --live-s 3

The run file: a copy of tests/tui/data/leaky.sqlite (a real example run: layers, inventories, a
leak) with host samples appended until it holds ``--samples`` rows, one step per 100 samples,
at 1 kHz. The content is deterministic. Printed (not asserted):

- ``load``: :func:`memscope_tui.data.load_snapshot` (all views' data), cold and warm, and its
  main parts;
- ``open``: from starting the app (headless, 80x24) to the first snapshot drawn; and, when tmux
  is installed, ``memscope tui`` in a real terminal from the command to the timeline on screen;
- ``live``: while another process appends 1,000 samples/s, refreshes every 0.5 s: the reader
  thread's time per refresh, and the longest the UI's event loop went without running a 20 ms
  timer (what blocking would show as).
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
    from memscope.analysis.summary import summarize
    from memscope.analysis.timeline import memory_timeline
    from memscope.store.reader import RunReader
    from memscope_tui.data import load_snapshot

    began, cpu = time.perf_counter(), time.process_time()
    snap = load_snapshot(str(db))
    cold, cpu = time.perf_counter() - began, time.process_time() - cpu
    warm = _median_time(lambda: load_snapshot(str(db)))
    print(f"load     cold {cold * 1000:7.0f} ms   warm {warm * 1000:7.0f} ms   "
          f"CPU {cpu * 1000:.0f} ms over its threads   "
          f"({snap.summary.samples} samples, {snap.summary.steps} steps)")
    with RunReader(db) as reader:
        print(f"  summarize        {_median_time(lambda: summarize(reader)) * 1000:7.0f} ms")
        print(f"  memory_timeline  {_median_time(lambda: memory_timeline(reader, 200)) * 1000:7.0f} ms")


async def _open(db: Path) -> tuple[float, float]:
    from memscope_tui.app import MemscopeApp

    began = time.perf_counter()
    app = MemscopeApp(str(db))
    async with app.run_test(size=(80, 24)) as pilot:
        while app.loads < 1:
            await pilot.pause(0.005)
        drawn = time.perf_counter() - began
        assert app.snapshot is not None
        return drawn, app.snapshot.read_s


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
        conn.execute("COMMIT")
        time.sleep(0.05)
    conn.close()


async def _live(db: Path, seconds: float) -> tuple[list[float], float, int]:
    from memscope_tui.app import MemscopeApp

    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE run SET status = 'running', ended = NULL, exit_code = NULL")
    conn.close()
    app = MemscopeApp(str(db))
    reads: list[float] = []
    gaps: list[float] = []
    async with app.run_test(size=(80, 24)) as pilot:
        while app.loads < 1:
            await pilot.pause(0.01)
        writer = subprocess.Popen([sys.executable, __file__, "--write", str(db), str(seconds + 1)])
        last = time.perf_counter()
        seen = app.loads
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            await asyncio.sleep(0.02)  # runs on the UI's event loop: late wake-ups = a blocked UI
            now = time.perf_counter()
            gaps.append(now - last - 0.02)
            last = now
            if app.loads != seen and app.snapshot is not None:
                seen = app.loads
                reads.append(app.snapshot.read_s)
        refreshes = app.loads - 1
    writer.wait()
    return reads, max(gaps) if gaps else 0.0, refreshes


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
        drawn, read = asyncio.run(_open(db))
        print(f"open     first snapshot drawn {drawn * 1000:.0f} ms after the app started "
              f"(reading {read * 1000:.0f} ms of it)")
        term = _terminal_open(db)
        if term is not None:
            print(f"terminal `memscope tui` in tmux: timeline on screen {term * 1000:.0f} ms after "
                  "the command started (python start-up included)")
        reads, gap, refreshes = asyncio.run(_live(db, args.live_s))
        if reads:
            print(f"live     {refreshes} refreshes in {args.live_s:g} s; read per refresh median "
                  f"{statistics.median(reads) * 1000:.0f} ms, max {max(reads) * 1000:.0f} ms; "
                  f"longest UI stall {gap * 1000:.0f} ms")
        else:
            print("live     no refresh happened", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

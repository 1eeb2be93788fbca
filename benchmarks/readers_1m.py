"""Every reader on a 1,000,000-step run file built from a real run, and at 100,000 steps.

    .venv/bin/python benchmarks/readers_1m.py                    # 1M and 100k steps
    .venv/bin/python benchmarks/readers_1m.py --steps 200000 --small 20000 --keep /tmp/big.db

The run file: ``memscope attach --headless`` on ``examples/tiny_gpt.py`` (a real training, a few
dozen steps), then its block of steps copied in SQL until the file holds ``--steps`` steps, each
copy's step numbers and times shifted past the one before; per block: its steps, host samples
(``--samples-per-step``, taken from the real ones), the per-layer rows of a profiled step every
``layers_every`` steps and a tensor inventory on the agent's own thinning schedule (so the file
holds what the agent would have written, at defaults, for a long run of that loop).

Each reader runs as its own process (``python -m memscope ...``): wall seconds, CPU seconds
(user + system: what it costs on an idle machine, whatever else runs beside it) and its peak RSS
(from ``os.wait4``, that child's own). The dashboard's first paint is the time from starting the
app (Textual's ``run_test``, 80x24, in its own process) to its first snapshot drawn. Printed,
never asserted; the ratio column is 1M over 100k. ``PYTHONPATH=OTHER_CHECKOUT`` times another
memscope's readers on the same files (the readers run outside this checkout).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny_gpt.py"
LAYERS_EVERY = 50  # the agent's default per-layer cadence (AgentOptions.layers_every)


def real_run(path: Path, steps: int) -> None:
    """A short real training, recorded."""
    cmd = [sys.executable, "-m", "memscope", "attach", "--headless", "--force", "--db", str(path),
           str(EXAMPLE), "--steps", str(steps)]  # the memscope of this checkout (cwd: its root)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=ROOT)


def inventory_steps(total: int) -> list[int]:
    """Steps the default schedule inventories over ``total`` steps, its time budget aside:
    every step through DENSE_STEPS, then every step // DENSITY."""
    from memscope.agent.collectors.inventory.schedule import Schedule

    sched = Schedule(1, 0.0)
    sched.budget = 1.0  # thinning on, the time budget never the limit
    sched.elapsed_s = 1e12
    out = []
    for step in range(total):
        if sched.due(step):
            out.append(step)
            sched.taken(step, 0.0)
    return out


def grow(base: Path, out: Path, total: int, per_step: float) -> None:
    """Copy ``base`` to ``out`` and repeat its steps (and their rows) until ``total`` steps."""
    shutil.copy(base, out)
    conn = sqlite3.connect(out, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    proc, n, first, t0, t1 = conn.execute(
        "SELECT proc, count(*), min(step), min(start), max(end) FROM steps WHERE status = 'ok'").fetchone()
    block_s = t1 - t0
    blocks = -(-total // n)
    conn.execute("BEGIN")
    # keep only the whole steps of the real run: the copies start where its last step ended
    conn.execute("DELETE FROM samples WHERE t < ? OR t >= ?", (t0, t1))
    rowids = [r[0] for r in conn.execute("SELECT rowid FROM samples ORDER BY t")]
    keep = min(len(rowids), max(1, round(per_step * n)))
    kept = {rowids[i * len(rowids) // keep] for i in range(keep)}  # evenly spread over the block
    conn.executemany("DELETE FROM samples WHERE rowid = ?", ((r,) for r in rowids if r not in kept))
    conn.execute("CREATE TEMP TABLE k (k INTEGER PRIMARY KEY)")
    conn.executemany("INSERT INTO k VALUES (?)", ((i,) for i in range(1, blocks)))
    cols = [r[1] for r in conn.execute("PRAGMA table_info(steps)")]
    shifted = {"step": f"step + k * {n}", "start": f"start + k * {block_s!r}", "end": f"end + k * {block_s!r}"}
    conn.execute(f"INSERT INTO steps ({', '.join(cols)}) SELECT "
                 f"{', '.join(shifted.get(c, c) for c in cols)} FROM steps, temp.k WHERE proc = ?"
                 f" AND step + k * {n} < {first + total} ORDER BY k, step", (proc,))
    # in time order, as the agent writes them (readers may count on rowid order following time)
    conn.execute(f"INSERT INTO samples (proc, t, step, phase, rss) SELECT proc, t + k * {block_s!r},"
                 f" step + k * {n}, phase, rss FROM samples, temp.k WHERE proc = ?"
                 f" AND step + k * {n} < {first + total} ORDER BY k, t", (proc,))
    # per-layer rows on the agent's cadence, copied from the real run's profiled step
    src = conn.execute("SELECT min(step) FROM layer_stats WHERE proc = ?", (proc,)).fetchone()[0]
    if src is not None:
        lcols = [r[1] for r in conn.execute("PRAGMA table_info(layer_stats)")]
        for table, tcols in (("layer_stats", lcols),
                             ("step_breakdown", [r[1] for r in conn.execute("PRAGMA table_info(step_breakdown)")])):
            sel = ", ".join("x.step" if c == "step" else f"{table}.{c}" for c in tcols)
            conn.execute(f"INSERT OR IGNORE INTO {table} ({', '.join(tcols)}) SELECT {sel}"
                         f" FROM {table}, (SELECT step FROM steps WHERE proc = ? AND step > ?"
                         f" AND (step - ?) % {LAYERS_EVERY} = 0) AS x WHERE {table}.proc = ?"
                         f" AND {table}.step = ?", (proc, src, src, proc, src))
    # tensor inventories on the agent's schedule, copied from the real run's last one
    last = conn.execute("SELECT max(step) FROM inventories WHERE proc = ?", (proc,)).fetchone()[0]
    if last is not None:
        have = {r[0] for r in conn.execute("SELECT step FROM inventories WHERE proc = ?", (proc,))}
        wanted = [s for s in inventory_steps(first + total) if s > last and s not in have]
        conn.execute("CREATE TEMP TABLE inv (step INTEGER PRIMARY KEY)")
        conn.executemany("INSERT INTO inv VALUES (?)", ((s,) for s in wanted))
        for table in ("inventories", "inventory_groups", "leak_holders"):
            tcols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            sel = ", ".join("inv.step" if c == "step" else f"{table}.{c}" for c in tcols)
            conn.execute(f"INSERT INTO {table} ({', '.join(tcols)}) SELECT {sel} FROM {table}, temp.inv"
                         f" WHERE {table}.proc = ? AND {table}.step = ?", (proc, last))
    conn.execute("UPDATE run SET ended = (SELECT max(end) FROM steps) + 0.5")
    conn.execute("UPDATE processes SET ended = (SELECT max(end) FROM steps) + 0.5,"
                 " samples = (SELECT count(*) FROM samples)")
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()


def readers(db: Path, tmp: Path) -> list[tuple[str, list[str]]]:
    m = [sys.executable, "-m", "memscope"]
    return [
        ("report", [*m, "report", str(db)]),
        ("report --json", [*m, "report", str(db), "--json"]),
        ("report --html", [*m, "report", str(db), "--html", str(tmp / "r.html")]),
        # the timeline model alone (memory, categories, leak growth, marks), as a notebook reads it
        ("load().timeline()", [sys.executable, "-c", f"import memscope; memscope.load({str(db)!r}).timeline()"]),
        ("leaks", [*m, "leaks", str(db)]),
        ("layers", [*m, "layers", str(db)]),
        ("oom", [*m, "oom", str(db)]),
        ("export --chrome", [*m, "export", str(db), "--chrome", str(tmp / "trace.json")]),
        ("export --csv", [*m, "export", str(db), "--csv", str(tmp / "csv")]),
        ("dashboard first paint", [sys.executable, __file__, "--paint", str(db)]),
    ]


def timed(cmd: list[str]) -> tuple[float, float, float, int, str]:
    """(wall seconds, CPU seconds, peak RSS MiB, exit status, last stdout line) of one child
    process (CPU time: what it costs on an idle machine, whatever else runs beside it)."""
    began = time.perf_counter()
    # cwd elsewhere: ``-m memscope`` imports the memscope on sys.path (PYTHONPATH can pick one)
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             cwd=tempfile.gettempdir())
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - began
    child.returncode = os.waitstatus_to_exitcode(status)
    lines = out.strip().splitlines()
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, child.returncode, lines[-1] if lines else ""


def paint(db: str) -> None:
    """In its own process: seconds from the app's start to its first frame drawn (the overview;
    the other views load after it), and the process's CPU seconds by then (imports included)."""
    import asyncio

    from memscope_tui.app import MemscopeApp

    painted: list[float] = []

    class Timed(MemscopeApp):
        CSS_PATH = str(Path(sys.modules[MemscopeApp.__module__].__file__ or "").with_name("app.tcss"))

        def _apply(self, snap: Any) -> None:
            super()._apply(snap)
            if self.paints == 1:  # once that frame is on the (virtual) screen
                self.call_after_refresh(lambda: painted.extend((time.perf_counter(), time.process_time())))

    async def go() -> tuple[float, float]:
        began = time.perf_counter()
        app = Timed(db)
        async with app.run_test(size=(80, 24)):
            while not painted:  # a plain sleep: Pilot's pause would spend CPU in the app meanwhile
                await asyncio.sleep(0.005)
            return painted[0] - began, painted[1]

    wall, cpu = asyncio.run(go())
    print(f"{wall:.3f} {cpu:.3f}")


def measure(db: Path, tmp: Path) -> dict[str, tuple[float, float, float, int]]:
    out = {}
    for name, cmd in readers(db, tmp):
        wall, cpu, rss, rc, last = timed(cmd)
        if name.startswith("dashboard") and rc == 0:
            # the app's own clock, start to first frame (imports excluded); the CPU the process
            # had used by then (imports included; the full read that follows is not)
            wall, cpu = (float(x) for x in last.split())
        out[name] = (wall, cpu, rss, rc)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--small", type=int, default=100_000, help="the second, smaller file (0: none)")
    p.add_argument("--real-steps", type=int, default=40, help="steps of the real training copied")
    p.add_argument("--samples-per-step", type=float, default=1.0)
    p.add_argument("--base", help="use this real run file instead of recording one")
    p.add_argument("--keep", metavar="PATH", help="keep the big run file here")
    p.add_argument("--paint", help=argparse.SUPPRESS)
    p.add_argument("--grow", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.grow:
        grow(Path(args.grow[0]), Path(args.grow[1]), int(args.grow[2]), float(args.grow[3]))
        return 0
    if args.paint:
        paint(args.paint)
        return 0
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base = Path(args.base) if args.base else tmp / "real.db"
        if not args.base:
            began = time.perf_counter()
            real_run(base, args.real_steps)
            print(f"real run: {args.real_steps} steps of tiny_gpt in {time.perf_counter() - began:.1f} s")
        results = {}
        for total in [t for t in (args.steps, args.small) if t > 0]:
            db = Path(args.keep) if args.keep and total == args.steps else tmp / f"run{total}.db"
            began = time.perf_counter()
            # in a child: a forked reader starts from its parent's peak RSS, so the parent stays small
            subprocess.run([sys.executable, __file__, "--grow", str(base), str(db), str(total),
                            str(args.samples_per_step)], check=True)
            print(f"{total:,} steps: {db.stat().st_size / 1e6:.0f} MB built in "
                  f"{time.perf_counter() - began:.1f} s; load average {os.getloadavg()[0]:.1f}")
            results[total] = measure(db, tmp)
        big, small = results.get(args.steps), results.get(args.small)
        print(f"\n{'reader':22} {'big: wall s':>11} {'CPU s':>6} {'MB':>5}   {'small: wall s':>13} {'CPU s':>6}"
              f" {'MB':>5}   {'CPU ratio':>9}")
        failed = False
        for name in (big or small or {}):
            row = f"{name:22}"
            for res, w in ((big, 11), (small, 13)):
                if res is not None:
                    wall, cpu, rss, rc = res[name]
                    failed |= rc != 0
                    row += f" {wall:{w}.2f} {cpu:6.2f} {rss:5.0f}  " + ("" if rc == 0 else f" exit {rc}")
            if big and small and small[name][1] > 0:
                row += f" {big[name][1] / small[name][1]:9.1f}"
            print(row)
        print(f"(big: {args.steps:,} steps, small: {args.small:,}; dashboard wall: from the app's start "
              "to its first frame drawn; CPU: the process's until then, imports included; MB: its whole "
              "process, the full read after the first frame included)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

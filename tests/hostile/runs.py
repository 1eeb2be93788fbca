"""Run files that carry the hostile corpus (tests/test_hostile_corpus.py, tests/tui/...):

* :func:`attached`: a real training script (hostile_train.py) under ``memscope attach``: module
  names (``add_module``), class names and a leak's holder from the corpus;
* :func:`edited`: a real run file (tests/tui/data/leaky.sqlite) edited with sqlite3: every text
  column a view shows set to corpus strings, an OOM event, and tables named like paths.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from corpus import corpus

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLEAN = ROOT / "tests" / "tui" / "data" / "leaky.sqlite"
FULL = ("--layers-every", "1", "--inventory-every", "1")


def attached(directory: Path, trap: Path, steps: int = 14) -> Path:
    """hostile_train.py under ``memscope attach --headless`` at full detail."""
    db = directory / "attached.db"
    out = subprocess.run([sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db),
                          *FULL, str(HERE / "hostile_train.py"), str(trap), str(steps)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    return db


def clean(directory: Path) -> Path:
    db = directory / "clean.db"
    shutil.copy(CLEAN, db)
    return db


def edited(directory: Path, trap: Path, victim: Path) -> Path:
    """leaky.sqlite with corpus strings in every shown text column, and two tables whose names
    are paths (one relative, climbing out; one absolute, at ``victim`` without its .csv)."""
    db = directory / "edited.db"
    shutil.copy(CLEAN, db)
    names = list(corpus(str(trap)).values())
    con = sqlite3.connect(db)
    with con:
        steps = [r[0] for r in con.execute("SELECT DISTINCT step FROM layer_stats")]
        proc = con.execute("SELECT min(id) FROM processes").fetchone()[0]
        # the biggest modules of every profiled step (a view shows the peak's, which the OOM event
        # below can make step 5): at the top of every view
        for step in steps:
            for i, name in enumerate(names):
                con.execute("INSERT INTO layer_stats (proc, step, module, type, calls, saved_bytes, "
                            "saved_tensors, output_bytes, forward_s) VALUES (?, ?, ?, ?, 1, ?, 1, ?, 0.001)",
                            (proc, step, f"evil.{i}.{name}", name, 10**9 - i, 10**6))
        con.execute("UPDATE run SET command = ?, host = ?", (json.dumps(["python", *names[:-1]]), names[9]))
        con.execute("UPDATE processes SET host = ?, device = ?, torch = ?", (names[0], names[8], names[13]))
        con.execute("UPDATE leak_holders SET held_by = ?, site = ?", (names[10] + names[0], names[15]))
        con.execute("UPDATE steps SET status = ? WHERE step = 3", (names[12],))
        con.execute("UPDATE samples SET phase = ? WHERE rowid % 7 = 0", (names[16],))
        for name in names:
            con.execute("INSERT INTO events (proc, t, step, kind, message, data) VALUES (?, 0, 1, ?, ?, ?)",
                        (proc, "warning", name, json.dumps({"why": name})))
        con.execute("INSERT INTO events (proc, t, step, kind, message, data) VALUES (?, 0, 5, 'oom', ?, ?)",
                    (proc, names[14], json.dumps({
                        "step": 5, "phase": names[3], "module": names[0], "module_type": names[1],
                        "module_stack": names[:6], "message": names[14], "site": names[11],
                        "exception": names[7], "requested_bytes": 1 << 20, "live_bytes": 1 << 20})))
        con.execute('CREATE TABLE "../../traversed" (x TEXT)')
        con.execute('INSERT INTO "../../traversed" VALUES (\'escaped\')')
        absolute = str(victim.with_suffix(""))
        con.execute(f'CREATE TABLE "{absolute}" (x TEXT)')
        con.execute(f'INSERT INTO "{absolute}" VALUES (\'overwritten\')')
    con.close()
    return db

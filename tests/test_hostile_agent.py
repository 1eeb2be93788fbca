"""The agent works out of the training program's sight (issue 22, DESIGN.md section 5): real
scripts under ``memscope attach``, compared with the same scripts run plainly."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from conftest import memscope

HOSTILE = Path(__file__).parent / "hostile"
FULL = ("--layers-every", "1", "--layers-first", "0", "--inventory-every", "1")


def _plain(script: Path) -> str:
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def _attached(tmp_path: Path, script: Path, *options: str) -> str:
    out = memscope("attach", "--headless", "--db", str(tmp_path / "run.db"), *options, str(script))
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_threads_do_not_run_the_scripts_tracers(tmp_path: Path) -> None:
    """threading.settrace / setprofile before torch is imported (so before the agent starts its
    sampler, writer and watchdog): the hooks run in the script's own threads only."""
    plain = _plain(HOSTILE / "tracer_train.py")
    attached = _attached(tmp_path, HOSTILE / "tracer_train.py")
    threads = next(line for line in attached.splitlines() if line.startswith("threads "))
    assert "memscope-sampler" in threads and "memscope-writer" in threads  # they did run
    traced = [line for line in attached.splitlines() if line.startswith(("traced ", "profiled "))]
    assert "user-worker" in traced[0]
    assert traced == [line for line in plain.splitlines() if line.startswith(("traced ", "profiled "))]
    assert "memscope" not in "".join(traced)


def test_subclass_sees_only_its_own_calls(tmp_path: Path) -> None:
    """A tensor subclass counting __torch_function__ calls counts as many under attach at full
    detail (layers, inventories and leak sites every step) as without (before: 36 -> 152)."""
    plain = _plain(HOSTILE / "subclass_train.py").strip()
    assert plain.startswith("torch_function calls ") and int(plain.split()[-1]) > 0
    assert _attached(tmp_path, HOSTILE / "subclass_train.py", *FULL).strip() == plain
    with sqlite3.connect(tmp_path / "run.db") as db:  # the agent did look at them
        assert db.execute("SELECT count(*) FROM inventories").fetchone()[0] >= 5
        assert db.execute("SELECT sum(saved_bytes) FROM layer_stats").fetchone()[0] > 0


def test_loop_moving_to_the_main_thread_is_not_the_scripts_hooks(tmp_path: Path) -> None:
    """Steps 0-3 on a worker thread, 4-7 on the main thread, every step profiled: memscope's own
    saved-tensors hooks left on the main thread are not reported as the script's, and the steps
    on the main thread are measured."""
    _attached(tmp_path, HOSTILE / "thread_switch_train.py", *FULL)
    with sqlite3.connect(tmp_path / "run.db") as db:
        events = db.execute("SELECT message FROM events WHERE message LIKE '%saved-tensors%'").fetchall()
        assert events == []
        saved = dict(db.execute("SELECT step, sum(saved_bytes) FROM layer_stats GROUP BY step"))
    assert all(saved[step] > 0 for step in range(4, 8)), saved

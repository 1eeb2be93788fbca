"""``--max-steps N``: the agent ends the training process cleanly at a step boundary."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from conftest import cli, memscope

SCRIPT = '''
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F

mode = sys.argv[1]
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1) if mode == "optimizer" else None
done = 0
try:
    for step in range(50):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
        done += 1
    print("loop finished", flush=True)
finally:
    print(f"finally ran after {done} iterations", flush=True)
'''


def _rows(db: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _run(tmp_path: Path, mode: str, n: int) -> tuple[object, Path]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    db = tmp_path / "run.db"
    out = memscope("attach", "--db", str(db), "--headless", "--max-steps", str(n), str(script), mode)
    return out, db


def test_max_steps_ends_the_run_cleanly_after_n_optimizer_steps(tmp_path: Path) -> None:
    out, db = _run(tmp_path, "optimizer", 3)
    assert out.returncode == 0, out.stderr
    # SystemExit unwinds the user's loop: its finally runs, the code after the loop does not
    assert "finally ran after 2 iterations" in out.stdout  # the 3rd opt.step() raised it
    assert "loop finished" not in out.stdout
    assert "Traceback" not in out.stderr
    assert _rows(db, "SELECT count(*) FROM steps WHERE status = 'ok'") == [(3,)]
    assert _rows(db, "SELECT status, exit_code FROM run") == [("finished", 0)]
    assert _rows(db, "SELECT status FROM processes") == [("stopped",)]
    events = _rows(db, "SELECT step, message, data FROM events WHERE kind = 'max_steps'")
    assert len(events) == 1 and "after 3 step(s)" in events[0][1]
    assert '"steps": 3' in events[0][2]
    assert _rows(db, "SELECT count(*) FROM samples")[0][0] >= 2  # the writer flushed
    report = cli("report", str(db))  # the report says the run was cut short on purpose
    assert report.returncode == 0
    assert "status    finished, exit 0 · run ended on purpose after 3 step(s)" in report.stdout


def test_max_steps_with_steps_ended_by_backward(tmp_path: Path) -> None:
    out, db = _run(tmp_path, "backward", 2)
    assert out.returncode == 0, out.stderr
    assert "finally ran after 1 iterations" in out.stdout  # the 2nd backward() raised it
    assert _rows(db, "SELECT count(*) FROM steps WHERE status = 'ok'") == [(2,)]
    assert _rows(db, "SELECT step_mode, status FROM processes") == [("backward", "stopped")]
    assert _rows(db, "SELECT count(*) FROM events WHERE kind = 'max_steps'") == [(1,)]


def test_without_max_steps_the_script_runs_to_its_end(tmp_path: Path) -> None:
    out, db = _run(tmp_path, "optimizer", 0)
    assert out.returncode == 0, out.stderr
    assert "loop finished" in out.stdout and "after 50 iterations" in out.stdout
    assert _rows(db, "SELECT count(*) FROM events WHERE kind = 'max_steps'") == [(0,)]


def test_bad_max_steps_is_one_line_and_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    for bad in ("-1", "three"):
        out = memscope("attach", "--db", str(tmp_path / "x.db"), "--max-steps", bad, str(script), "optimizer")
        assert out.returncode == 2
        assert out.stderr.count("\n") == 1 and "max" in out.stderr and "Traceback" not in out.stderr
        assert not (tmp_path / "x.db").exists()

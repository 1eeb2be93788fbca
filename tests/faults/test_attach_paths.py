"""What ``attach`` does with paths and names, and how a ^C run is called.

--force replaces only a memscope run file or an empty regular file; a symbolic link given as
--db is refused (dangling or not); ``-m MODULE`` names the run file after the module and a
module that does not exist leaves no file behind; a run ended by ^C is ``interrupted``.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import pytest

from conftest import memscope
from faults.runs import LOOP, finish, report, start_attach, wait_steps

TRUE = "/bin/true"


def attach(db: Path, *extra: str) -> "object":
    return memscope("attach", "--headless", *extra, "--db", str(db), "--", TRUE)


def test_force_replaces_run_files_and_empty_files_only(tmp_path: Path) -> None:
    run = tmp_path / "run.db"
    assert attach(run).returncode == 0
    res = attach(run)
    assert res.returncode == 2 and "--force" in res.stderr
    assert attach(run, "--force").returncode == 0  # a run file: replaced

    precious = tmp_path / "notes.txt"
    precious.write_text("my notes")
    res = attach(precious, "--force")
    assert res.returncode == 2 and "not a memscope run file" in res.stderr
    assert precious.read_text() == "my notes"

    other = tmp_path / "other.db"  # an SQLite file of something else
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    res = attach(other, "--force")
    assert res.returncode == 2 and "not a memscope run file" in res.stderr
    assert other.stat().st_size > 0

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    res = attach(fifo, "--force")
    assert res.returncode == 2 and "not a regular file" in res.stderr

    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert attach(empty, "--force").returncode == 0
    assert report(empty)["run"]["status"] == "finished"


def test_symlinks_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "target.db"
    link = tmp_path / "link.db"
    link.symlink_to(target)  # dangling
    res = attach(link)
    assert res.returncode == 2 and "symbolic link" in res.stderr
    assert not target.exists() and not target.parent.exists()
    res = attach(link, "--force")
    assert res.returncode == 2 and "symbolic link" in res.stderr
    real = tmp_path / "real.db"
    assert attach(real).returncode == 0
    link.unlink()
    link.symlink_to(real)  # to a run file: still refused, the run file untouched
    before = real.read_bytes()
    res = attach(link, "--force")
    assert res.returncode == 2 and "symbolic link" in res.stderr and real.read_bytes() == before


def test_stale_wal_beside_a_new_name_is_not_read_into_it(tmp_path: Path) -> None:
    old = tmp_path / "run.db"
    assert attach(old).returncode == 0
    wal = Path(str(old) + "-wal")
    wal.write_bytes(b"x" * 4096)  # left over from an earlier file of that name
    old.unlink()
    res = attach(old)
    assert res.returncode == 2 and "-wal" in res.stderr and not old.exists()
    assert attach(old, "--force").returncode == 0 and not wal.exists()


def test_module_runs_are_named_after_the_module(tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("print('trained')\n")
    res = memscope("attach", "--headless", "-m", "mypkg.train", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (made,) = tmp_path.glob("memscope-*.db")
    assert made.name.startswith("memscope-mypkg.train-"), made.name
    for missing in ("nonexistent", "mypkg.nope", "mypkg.train.deeper"):
        res = memscope("attach", "--headless", "-m", missing, cwd=tmp_path)
        assert res.returncode == 2 and "no module named" in res.stderr, res.stderr
    assert [p.name for p in tmp_path.glob("memscope-*")] == [made.name]  # nothing left behind


@pytest.mark.slow
def test_ctrl_c_is_interrupted_not_failed(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    attach_proc = start_attach(db, LOOP, "--steps", "1000", "--sleep", "0.05")
    wait_steps(db, 3, attach_proc)
    os.killpg(attach_proc.pid, signal.SIGINT)  # a terminal's ^C: the whole process group
    code, _out, err = finish(attach_proc)
    run = report(db)["run"]
    assert run["status"] == "interrupted", (run, err)
    assert code == (run["exit_code"] if run["signal"] is None else 128 + run["signal"])
    # a ^C sent to memscope alone is forwarded; the script exits 1 from KeyboardInterrupt
    db2 = tmp_path / "run2.db"
    attach_proc = start_attach(db2, LOOP, "--steps", "1000", "--sleep", "0.05")
    wait_steps(db2, 3, attach_proc)
    attach_proc.send_signal(signal.SIGINT)
    code, _out, err = finish(attach_proc)
    run = report(db2)["run"]
    assert code == 1 and run["exit_code"] == 1 and run["status"] == "interrupted", (run, err)
    res = memscope("report", str(db2))
    assert "interrupted, exit 1" in res.stdout


@pytest.mark.slow
def test_a_healthy_run_keeps_every_row(tmp_path: Path) -> None:
    """The run from the fault pass that once lost a batch (its last step row with it):
    58 steps with an inventory at every one. Every step, and nothing dropped."""
    script = tmp_path / "s58.py"
    script.write_text(
        "import torch, torch.nn as nn\n"
        "torch.manual_seed(0)\n"
        "m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(58):\n"
        "    loss = nn.functional.cross_entropy(m(torch.randn(16, 32)), torch.randint(0, 4, (16,)))\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n")
    db = tmp_path / "run.db"
    res = memscope("attach", "--headless", "--db", str(db), "--inventory-every", "1", str(script),
                   timeout=300)
    assert res.returncode == 0, res.stderr
    doc = report(db)
    assert doc["run"]["steps"] == 58 and doc["run"]["dropped"] == 0, doc["run"]
    assert doc["run"]["recording"] == [] and doc["run"]["status"] == "finished"

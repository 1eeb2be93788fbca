"""Many ranks in one run: real ``torchrun`` DDP (gloo, CPU) under ``memscope attach``."""

from __future__ import annotations

import fcntl
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SCRIPTS, cli, free_port, memscope, report_json
from memscope.analysis.ranks import RankSummary, imbalance, rank_summaries
from memscope.store.reader import RunReader
from shared_runs import shared_attach, shared_dir

TORCHRUN = Path(sys.executable).parent / "torchrun"
MiB = 2 ** 20


def torchrun_attach(db: Path, *script_args: str, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    if not TORCHRUN.exists():
        pytest.skip("torchrun not installed beside this Python")
    out = memscope("attach", "--headless", "--db", str(db), "--", str(TORCHRUN),
                   "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
                   "--master-port", str(free_port()), str(SCRIPTS / "ddp.py"), *script_args,
                   timeout=240)
    return out


def _session_port(tmp_path_factory: pytest.TempPathFactory, name: str) -> int:
    """A rendezvous port picked once per session and kept in tests/shared_runs.py's directory, so
    that both xdist workers ask for the same command (a shared run is keyed by its command)."""
    where = shared_dir(tmp_path_factory)
    with open(where / f"{name}.port.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kept = where / f"{name}.port"
        if not kept.exists():
            kept.write_text(str(free_port()))
        return int(kept.read_text())


def heavy_rank_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """2-rank DDP under torchrun, rank 1 keeping 192 MiB more alive, 4 steps: made once per session
    (tests/shared_runs.py), read here and by tests/test_attach.py (the ranks recorded, not the
    launcher)."""
    if not TORCHRUN.exists():
        pytest.skip("torchrun not installed beside this Python")
    port = _session_port(tmp_path_factory, "heavy-rank")
    return shared_attach(tmp_path_factory, [], [
        "--", str(TORCHRUN), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
        "tests/scripts/ddp.py", "--steps", "4", "--heavy-rank", "1", "--heavy-mb", "192"], timeout=240)


def test_imbalance_is_spread_over_the_heaviest() -> None:
    def r(rank: int, peak: int | None) -> RankSummary:
        return RankSummary(rank, rank, "h", rank + 1, 3, peak, 1, 0.01, "stopped", False)

    assert imbalance([r(0, 100), r(1, 150), r(2, 200)]) == pytest.approx(0.5)
    assert imbalance([r(0, 300), r(1, 300)]) == 0.0
    assert imbalance([r(0, 0), r(1, 100)]) == 1.0  # defined even when a rank peaked at 0
    assert imbalance([r(0, 100)]) is None  # one rank: nothing to compare
    assert imbalance([r(0, 100), r(1, None)]) is None
    assert imbalance([r(0, 0), r(1, 0)]) is None


def test_two_ranks_recorded_and_the_heavy_one_shows(tmp_path_factory: pytest.TempPathFactory) -> None:
    db, out = heavy_rank_run(tmp_path_factory)
    assert out.returncode == 0, out.stderr
    rep = report_json(db)
    ranks = rep["ranks"]
    assert [(r["rank"], r["local_rank"], r["steps"], r["oom"]) for r in ranks] == \
        [(0, 0, 4, False), (1, 1, 4, False)]
    assert all(r["host"] == socket.gethostname() for r in ranks)
    # rank 1 keeps 192 MiB more alive than rank 0, which runs the same code otherwise
    gap = ranks[1]["peak_bytes"] - ranks[0]["peak_bytes"]
    assert 150 * MiB < gap < 260 * MiB, gap
    expected = gap / ranks[1]["peak_bytes"]
    assert rep["rank_imbalance"] == pytest.approx(expected, abs=1e-3)
    assert rep["oom"] is None
    # the library agrees with the process rows it reads
    with RunReader(db) as reader:
        rs = rank_summaries(reader)
    with sqlite3.connect(db) as conn:
        peaks = dict(conn.execute("SELECT proc, max(peak_rss) FROM steps GROUP BY proc").fetchall())
    assert {r.proc: r.peak_bytes for r in rs} == peaks
    text = cli("report", str(db))
    assert text.returncode == 0, text.stderr
    assert "ranks     2 processes" in text.stdout and "imbalance" in text.stdout
    table = [ln.split() for ln in text.stdout.splitlines() if ln.startswith("     ")]
    assert [row[0] for row in table] == ["0", "1"]


def test_the_rank_that_ran_out_of_memory_is_named(tmp_path: Path) -> None:
    db = tmp_path / "oom.db"
    out = torchrun_attach(db, "--steps", "5", "--oom-rank", "1", "--oom-step", "2")
    assert out.returncode != 0
    rep = report_json(db)
    assert rep["oom"] is not None and rep["oom"]["rank"] == 1 and rep["oom"]["step"] == 2
    assert [(r["rank"], r["oom"]) for r in rep["ranks"]] == [(0, False), (1, True)]
    assert rep["ranks"][1]["steps"] == 2
    text = cli("report", str(db)).stdout
    assert "out of memory on rank 1 at step 2" in text
    post = cli("oom", str(db)).stdout
    assert "where     rank 1, step 2, " in post, post
    assert any(ln.split()[0] == "1" and ln.rstrip().endswith("OOM") for ln in text.splitlines()
               if ln.startswith("     "))


def test_single_process_run_has_one_rank_and_no_table(tmp_path_factory: pytest.TempPathFactory) -> None:
    # the dashboard tests' 8-step run of tiny_gpt, made once per session (tests/shared_runs.py)
    db, out = shared_attach(tmp_path_factory, [], ["examples/tiny_gpt.py", "--steps", "8"])
    assert out.returncode == 0, out.stderr
    rep = report_json(db)
    assert len(rep["ranks"]) == 1 and rep["ranks"][0]["rank"] is None
    assert rep["ranks"][0]["steps"] == rep["run"]["steps"] == 8
    assert rep["rank_imbalance"] is None
    assert "ranks " not in cli("report", str(db)).stdout

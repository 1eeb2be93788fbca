"""Many ranks in one run: real ``torchrun`` DDP (gloo, CPU) under ``memscope attach``."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest

from conftest import cli, report_json
from memscope.analysis.ranks import RankSummary, imbalance, rank_summaries
from memscope.store.reader import RunReader
from shared_runs import shared_attach, shared_ddp

MiB = 2 ** 20


def heavy_rank_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """2-rank DDP under torchrun, rank 1 keeping 200 MiB more alive, 6 steps: made once per session
    (tests/shared_runs.py), read here, by tests/test_attach.py (the ranks recorded, not the
    launcher) and by docs/distributed.md's samples (tests/doc_samples.py)."""
    return shared_ddp(tmp_path_factory, "--steps", "6", "--heavy-rank", "1", "--heavy-mb", "200")


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
        [(0, 0, 6, False), (1, 1, 6, False)]
    assert all(r["host"] == socket.gethostname() for r in ranks)
    # rank 1 keeps 200 MiB more alive than rank 0, which runs the same code otherwise
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
    # the table under its head line (other lines start with spaces too: the whole run's peak
    # beside the steps', when sampling caught one outside them)
    lines = text.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("ranks     "))
    assert lines[at + 1].split()[:2] == ["rank", "local"]
    assert [ln.split()[0] for ln in lines[at + 2:at + 4]] == ["0", "1"]
    assert at + 4 == len(lines) or not lines[at + 4].lstrip()[:1].isdigit()


def test_the_rank_that_ran_out_of_memory_is_named(tmp_path_factory: pytest.TempPathFactory) -> None:
    # rank 1 out of memory at step 2: the run the dashboard's OOM view reads too, made once per
    # session (tests/shared_runs.py)
    db, out = shared_ddp(tmp_path_factory, "--steps", "5", "--oom-rank", "1", "--oom-step", "2")
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

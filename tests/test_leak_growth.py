"""Memory growth no tensor group explains, and DataLoader workers copying their dataset: real runs
at DEFAULT options, each against a control that must stay quiet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLES, cli, memscope, report_json
from memscope.analysis.unexplained import is_unexplained
from shared_runs import shared_attach

LEAKS = EXAMPLES / "leaks"


def test_growth_nothing_explains(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A numpy copy of each step's activations kept in a list: host memory in use (RSS less the
    free bytes malloc keeps) grows 256 KiB a step and a little, the tensor inventories see
    nothing grow (the verdict needs 16 steps after warm-up). The run is made once per session
    (tests/shared_runs.py): docs/leaks.md's sample reads it."""
    db, out = shared_attach(tmp_path_factory, [], ["examples/leaks/numpy_history.py", "--steps", "20"])
    assert out.returncode == 0, out.stderr
    report = report_json(db)
    assert report["leaks"] == [] and report["leak_check"]["verdict"] == "ok"
    g = report["unexplained_growth"]
    assert g is not None and g["metric"] == "host_in_use"
    assert 240 << 10 <= g["bytes_per_step"] <= 300 << 10  # 32 x 8 x 256 float32 = 256 KiB (260-268 measured)
    assert g["explained_bytes_per_step"] < 16 << 10 and g["last_step"] == 19
    # on memory in use a tensor's growth counts its bytes: no estimate
    assert g["tensor_factor"] == 1 and g["tensor_factor_estimated"] is False
    assert g["charged_bytes_per_step"] == g["explained_bytes_per_step"]
    assert g["unexplained_bytes_per_step"] == g["bytes_per_step"] - g["charged_bytes_per_step"]
    (sug,) = report["suggestions"]
    assert sug["technique"] == "fix_leak" and "tracemalloc" in sug["how"] and "host memory in use" in sug["evidence"]
    text = cli("leaks", str(db)).stdout
    assert "GROWTH host memory in use" in text and "no tensor group explains" in text
    assert "growth    host memory in use" in cli("report", str(db)).stdout
    _levels_made(db, tmp_path)


def _levels_made(db: Path, tmp_path: Path) -> None:
    """The same run file with its levels rewritten (every inventory of it was at a boundary, and
    each step after the first had one):

    * RSS rising 300 KiB a step and malloc's free bytes with it (a heap keeping what it freed
      while it warms up): RSS alone would call it growth; memory in use stays flat, no verdict;
    * RSS flat and the free bytes falling 300 KiB a step (a leak whose arrays reuse free memory):
      memory in use grows 300 KiB a step, reported;
    * memory in use a staircase of four 1.5 MiB jumps, one in each quarter (what a healthy
      30-step run's heap did under load: 5.6 MiB in six jumps): the envelope rises steadily by the
      quarters, but three jumps are most of it, no verdict; the same on RSS, with no free-bytes
      readings (musl, macOS, an older file), no verdict either."""
    import shutil
    import sqlite3

    from memscope.analysis.unexplained import steady_growth_of, unexplained_growth
    from memscope.store.reader import RunReader

    base = 300 << 20

    def made(name: str, rss: Any, free: Any) -> Any:
        path = tmp_path / f"{name}.db"
        shutil.copy(db, path)
        with sqlite3.connect(path) as conn:
            for step in range(20):
                conn.execute("UPDATE steps SET end_rss = ? WHERE step = ?", (rss(step), step))
                conn.execute("UPDATE inventories SET level = ?, heap_free = ? WHERE step = ?",
                             (rss(step), free(step), step))
            assert conn.execute("SELECT count(*) FROM inventories WHERE step >= 2").fetchone()[0] == 18
        with RunReader(str(path)) as reader:
            proc = reader.processes()[0]["id"]
            return steady_growth_of(reader, proc)[1], unexplained_growth(reader, proc)

    rss_found, u = made("kept_free", lambda s: base + (300 << 10) * s, lambda s: (4 << 20) + (300 << 10) * s)
    assert rss_found is not None and u is None
    rss_found, u = made("reused", lambda s: base, lambda s: (40 << 20) - (300 << 10) * s)
    assert rss_found is None and u is not None and u.metric == "host_in_use"
    assert u.bytes_per_step == 300 << 10 and u.tensor_factor == 1
    stairs = lambda s: base + (1536 << 10) * sum(s >= j for j in (4, 8, 12, 16))  # noqa: E731
    rss_found, u = made("stairs", stairs, lambda s: 1 << 20)
    assert rss_found is not None and u is None
    rss_found, u = made("stairs_rss", stairs, lambda s: None)
    assert rss_found is not None and u is None
    rss_found, u = made("steady_rss", lambda s: base + (300 << 10) * s, lambda s: None)  # no readings: RSS
    assert u is not None and u.metric == "rss" and u.tensor_factor == 4


def test_the_tensors_share_says_it_rests_on_the_rss_estimate() -> None:
    from memscope.analysis.unexplained import UnexplainedGrowth

    rss = UnexplainedGrowth("rss", 300 << 10, 10 << 10, 2, 29)
    assert rss.unexplained_bytes_per_step == (300 - 40) << 10
    assert rss.explained_words() == "+10.00 KiB/step of tensors, counted as +40.00 KiB/step of RSS (4x, an estimate)"
    cuda = UnexplainedGrowth("cuda_allocated", 300 << 10, 10 << 10, 2, 29)
    assert cuda.unexplained_bytes_per_step == 290 << 10 and cuda.explained_words() == "+10.00 KiB/step of tensors"
    assert UnexplainedGrowth("rss", 300 << 10, 0, 2, 29).explained_words() == "+0 B/step of tensors"


def test_heap_pages_a_tensor_leak_pins_are_the_tensors_growth() -> None:
    """Host RSS of a run leaking 32 KiB of tensors a step grew 113 KiB a step (the heap around the
    leaked tensors cannot be given back): that is the tensor leak, not a second one. Growth well
    beyond it, or growth with no tensor behind it, is still reported; on CUDA bytes are exact."""
    assert not is_unexplained("rss", 113_470, 32_768)  # examples/leaks/detached_list.py, measured
    assert is_unexplained("cuda_allocated", 113_470, 32_768)
    assert is_unexplained("rss", 289_370, 0)  # examples/leaks/numpy_history.py
    assert is_unexplained("rss", 300 << 10, 32 << 10)  # a numpy leak beside a tensor leak
    assert not is_unexplained("rss", 60 << 10, 0)  # under 64 KiB a step


def _levels(kib_per_step: list[int], steps_per_quarter: int = 4) -> list[tuple[int, int]]:
    """Boundary levels from step 2 on, rising by each quarter's rate (KiB a step)."""
    out, level, step = [(2, 100 << 20)], 100 << 20, 2
    for rate in kib_per_step:
        for _ in range(steps_per_quarter):
            step, level = step + 1, level + (rate << 10)
            out.append((step, level))
    return out


def test_steady_means_no_later_quarter_three_times_another_and_warm_up_may_lead() -> None:
    from memscope.analysis.unexplained import steady_growth

    # a 20-step numpy_history run under load (its quarters, KiB a step): warm-up on top of the leak
    assert steady_growth(_levels([460, 147, 266, 205])) is not None
    assert steady_growth(_levels([200, 200, 200, 200])) is not None
    assert steady_growth(_levels([600, 200, 200, 200])) is not None
    assert steady_growth(_levels([460, 147, 50, 10])) is None  # warm-up levelling off
    # a healthy 45-step run under load: within 3x, 78 KiB a step in all, 30 in its second half
    assert steady_growth(_levels([200, 62, 36, 24], steps_per_quarter=10)) is None
    assert steady_growth(_levels([300, 300, 90, 300])) is None  # a later quarter 3x slower
    assert steady_growth(_levels([60, 200, 200, 200])) is None  # the first 3x slower: it starts late


@pytest.mark.slow
def test_dataloader_workers_copy_on_read(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Forked workers reading a list of Python lists copy it into their private memory (USS);
    the same rows in one numpy array stay shared. The copying run is made once per session
    (tests/shared_runs.py): docs/leaks.md's sample reads it."""
    runs = {}
    db, out = shared_attach(tmp_path_factory, [], ["examples/leaks/dataloader_workers.py", "--rows", "40000",
                                                   "--epochs", "4"], timeout=300)
    assert out.returncode == 0, out.stderr
    runs["python"] = (db, report_json(db))
    db = tmp_path / "numpy.db"
    out = memscope("attach", "--headless", "--db", str(db), str(LEAKS / "dataloader_workers.py"),
                   "--rows", "40000", "--epochs", "4", "--numpy", timeout=300)
    assert out.returncode == 0, out.stderr
    runs["numpy"] = (db, report_json(db))
    db, report = runs["python"]
    w = report["dataloader_workers"]
    assert w is not None and w["workers"] == w["of_workers"] == 2
    assert w["uss_end"] - w["uss_start"] > 2 * (32 << 20)  # 40k x 64 floats each: ~80 MiB a worker
    assert w["steps"] and w["bytes_per_step"] > 0
    assert report["leaks"] == []
    fix = [s for s in report["suggestions"] if "DataLoader" in s["evidence"]]
    assert fix and "numpy arrays" in fix[0]["how"] and "13246" in fix[0]["how"]
    text = cli("leaks", str(db)).stdout
    assert "WORKERS 2 of 2 DataLoader worker(s)" in text
    _, control = runs["numpy"]
    assert control["dataloader_workers"] is None and control["suggestions"] == []

"""The agent works out of the training program's sight (issue 22, DESIGN.md section 5): real
scripts under ``memscope attach`` at full detail (layers, inventories, leak sites every step)."""

from __future__ import annotations

import ast
import contextlib
import io
import runpy
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import memscope

HOSTILE = Path(__file__).parent / "hostile"
FULL = ("--layers-every", "1", "--layers-first", "0", "--inventory-every", "1")


@pytest.fixture(autouse=True)
def _slow_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter's exit as a user's, last collection included (tests/fastexit)."""
    monkeypatch.setenv("MEMSCOPE_TEST_SLOW_EXIT", "1")


def _attached(tmp_path: Path, script: Path) -> str:
    out = memscope("attach", "--headless", "--db", str(tmp_path / "run.db"), *FULL, str(script))
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_tracers_and_a_loop_that_changes_thread(tmp_path: Path) -> None:
    """threading.settrace / setprofile before torch is imported (so before the agent starts its
    thread): the hooks run in the script's own threads only. Steps 0-3 on
    a worker thread, 4-7 on the main thread: memscope's own saved-tensors hooks left on the main
    thread are not reported as the script's, and the main thread's steps are measured."""
    lines = dict(line.split(" ", 1) for line in _attached(tmp_path, HOSTILE / "tracer_train.py").splitlines())
    # memscope's one thread ran (samples and writes share it: issue 21's address space)
    assert [t for t in ast.literal_eval(lines["threads"]) if "memscope" in t] == ["memscope"], lines["threads"]
    assert "user-worker" in lines["traced"] and "user-worker" in lines["profiled"]
    assert "memscope" not in lines["traced"] + lines["profiled"]  # before: all three memscope threads
    with sqlite3.connect(tmp_path / "run.db") as db:
        events = db.execute("SELECT message FROM events WHERE message LIKE '%saved-tensors%'").fetchall()
        saved = dict(db.execute("SELECT step, sum(saved_bytes) FROM layer_stats GROUP BY step"))
    assert events == []  # before: one false warning per step on the main thread
    assert all(saved[step] > 0 for step in range(4, 8)), saved


def test_subclass_sees_only_its_own_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor subclass counting __torch_function__ calls counts as many under attach at full
    detail as without (before: 36 -> 152)."""
    monkeypatch.setattr(sys, "argv", ["subclass_train.py"])
    with contextlib.redirect_stdout(io.StringIO()) as plain_out:  # without memscope, in this process
        runpy.run_path(str(HOSTILE / "subclass_train.py"), run_name="__main__")
    plain = plain_out.getvalue().strip()
    assert plain.startswith("torch_function calls ") and int(plain.split()[-1]) > 0
    assert _attached(tmp_path, HOSTILE / "subclass_train.py").strip() == plain
    with sqlite3.connect(tmp_path / "run.db") as db:  # the agent did look at them
        assert db.execute("SELECT count(*) FROM inventories").fetchone()[0] >= 5
        assert db.execute("SELECT sum(saved_bytes) FROM layer_stats").fetchone()[0] > 0


def test_live_fake_tensors_are_passed_by_without_a_warning(tmp_path: Path) -> None:
    """FakeTensors alive at every inventory (torch.compile's caches keep some: a compiled run on
    an H100 printed a FakeTensor data-pointer warning from the inventory's scan): nothing into
    the training's stderr at full detail, and no fake bytes counted as memory."""
    out = memscope("attach", "--headless", "--db", str(tmp_path / "run.db"), *FULL,
                   str(HOSTILE / "fake_alive_train.py"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "fakes FakeTensor meta"
    assert "Warning" not in out.stderr and "data pointer" not in out.stderr, out.stderr
    with sqlite3.connect(tmp_path / "run.db") as db:
        assert db.execute("SELECT count(DISTINCT step) FROM inventory_groups").fetchone()[0] == 6
        fake_shapes = db.execute("SELECT count(*) FROM inventory_groups WHERE shape IN"
                                 " ('[1024, 1024]', '[3, 5]')").fetchone()[0]
    assert fake_shapes == 0


def test_a_cpu_training_never_has_the_cuda_driver_asked(tmp_path: Path) -> None:
    """memscope asks whether CUDA is in use with ``torch.cuda.is_initialized()`` alone: in a
    process that has not touched CUDA, ``is_available()`` would have the CUDA runtime count the
    devices, which poisons fork (PyTorch's docs: CUDA fails in forked children) and fixes the
    visible devices before the script may set CUDA_VISIBLE_DEVICES. Counted on any machine: the
    script wraps every driver-asking call; at defaults and at full detail (layers, inventories
    every step), sampling at 200 Hz past the 1 s device rescan."""
    script = HOSTILE / "cpu_on_gpu_host_train.py"
    for extra in ((), FULL):
        out = memscope("attach", "--headless", "--force", "--db", str(tmp_path / "run.db"),
                       "--sample-hz", "200", *extra, str(script))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "cuda driver questions [] 0", (extra, out.stdout)
        with sqlite3.connect(tmp_path / "run.db") as db:  # the sampler did run its device scans
            assert db.execute("SELECT count(*) FROM samples").fetchone()[0] >= 100

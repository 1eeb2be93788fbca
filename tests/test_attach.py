"""``memscope attach`` end to end: real subprocesses, real training, real run files."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES, SCRIPTS, cli, memscope, report_json
from test_ranks import heavy_rank_run


def attach(db: Path, *command: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return memscope("attach", "--headless", "--db", str(db), *command, **kw)  # type: ignore[arg-type]


def test_example_steps_counted_exactly(run_db: Path) -> None:
    out = attach(run_db, str(EXAMPLES / "tiny_gpt.py"), "--steps", "12", "--eval-every", "4")
    assert out.returncode == 0, out.stderr
    report = report_json(run_db)
    assert report["schema"] == "memscope.report/1"
    run = report["run"]
    assert run["steps"] == 12  # three no_grad evaluations are not steps
    assert run["exit_code"] == 0 and run["signal"] is None
    assert run["device"] == "cpu"
    assert run["torch"].startswith("2.")
    # every sample the agent took reached the file (how many it took depends on the machine's
    # speed: a boundary's sample is skipped while the sampler thread takes one)
    with sqlite3.connect(run_db) as conn:
        taken = conn.execute("SELECT sum(samples) FROM processes").fetchone()[0]
    assert run["samples"] >= 1 and run["samples"] == taken
    assert run["command"][1:] == [str(EXAMPLES / "tiny_gpt.py"), "--steps", "12", "--eval-every", "4"]
    assert run["started"] < run["ended"]
    peak = report["peak"]
    with sqlite3.connect(run_db) as conn:
        steps = conn.execute("SELECT step, peak_rss, start, end FROM steps ORDER BY step").fetchall()
        in_steps = conn.execute(
            "SELECT max(rss) FROM samples s WHERE t BETWEEN (SELECT min(start) FROM steps)"
            " AND (SELECT max(end) FROM steps)").fetchone()[0]
    assert [r[0] for r in steps] == list(range(12))
    # the training peak is the largest per-step peak, and names its step
    top = max(steps, key=lambda r: r[1])
    assert (peak["bytes"], peak["step"]) == (top[1], top[0])
    assert peak["bytes"] >= in_steps > 0  # no sample inside a step exceeds its step's peak
    assert report["leaks"] == []  # a healthy run: no leak, so no fix_leak advice either
    assert all(s["technique"] != "fix_leak" for s in report["suggestions"])
    assert report["hotspots"]  # step 1 is profiled by default
    assert report["oom"] is None
    # the headless summary names the run file and the steps
    assert str(run_db) in out.stderr and "12 steps" in out.stderr


@pytest.mark.parametrize("mode,expected", [
    ("optimizer", 6), ("backward", 6), ("manual", 6), ("gan", 6), ("accum", 6),
])
def test_step_boundaries_by_mode(run_db: Path, mode: str, expected: int) -> None:
    out = attach(run_db, str(SCRIPTS / "loop.py"), "--mode", mode, "--steps", "6", "--eval-every", "2")
    assert out.returncode == 0, out.stderr
    assert report_json(run_db)["run"]["steps"] == expected
    with sqlite3.connect(run_db) as conn:
        step_mode = conn.execute("SELECT step_mode FROM processes").fetchone()[0]
        starts_ends = conn.execute("SELECT start, end FROM steps ORDER BY step").fetchall()
    assert step_mode == {"gan": "optimizer", "accum": "optimizer"}.get(mode, mode)
    # steps tile the timeline: each starts where the previous ended, none is empty
    for (_s0, e0), (s1, e1) in zip(starts_ends, starts_ends[1:]):
        assert e0 == s1 and e1 > s1


Exit3 = tuple[subprocess.CompletedProcess[str], Path, Path]  # attach's result, the run file, the dump


@pytest.fixture(scope="module")
def exit_3_with_user_site(tmp_path_factory: pytest.TempPathFactory) -> Exit3:
    """One run read by the two tests below: loop.py exiting with status 3, under a PYTHONPATH
    holding the user's own sitecustomize.py (which sets a marker the script dumps)."""
    d = tmp_path_factory.mktemp("exit3")
    site = d / "site"
    site.mkdir()
    # the marker is the pid of the process it ran in: attach's own Python runs it too (the same
    # PYTHONPATH), and its environment is the child's, so "yes" would pass with no chain at all
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = str(os.getpid())\n")
    dump, db = d / "dump.json", d / "run.db"
    out = attach(db, str(SCRIPTS / "loop.py"), "--steps", "2", "--exit", "3", "--dump", str(dump),
                 env={"PYTHONPATH": str(site)})
    return out, db, dump


def test_exit_code_passes_through(exit_3_with_user_site: Exit3) -> None:
    out, run_db, _ = exit_3_with_user_site
    assert out.returncode == 3, out.stderr
    run = report_json(run_db)["run"]
    assert run["exit_code"] == 3 and run["steps"] == 2


def test_script_sees_what_plain_python_gives_it(tmp_path: Path) -> None:
    dump = tmp_path / "dump.json"
    script = str(SCRIPTS / "loop.py")
    subprocess.run([sys.executable, script, "--steps", "1", "--dump", str(dump), "x y"],
                   cwd=tmp_path, check=True, capture_output=True)
    a = json.loads(dump.read_text())
    dump.unlink()
    out = memscope("attach", "--headless", "--db", str(tmp_path / "r.db"), script, "--steps", "1",
                   "--dump", str(dump), "x y", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    b = json.loads(dump.read_text())
    assert a["argv"] == b["argv"] and a["path0"] == b["path0"] == str(SCRIPTS)
    assert a["name"] == b["name"] == "__main__"
    assert a["cwd"] == b["cwd"] == str(tmp_path)


def test_module_mode_and_command_mode(tmp_path: Path) -> None:
    pkg = tmp_path / "trainpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text((SCRIPTS / "loop.py").read_text())
    out = memscope("attach", "--headless", "--db", "m.db", "-m", "trainpkg.train", "--steps", "3",
                   cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert report_json(tmp_path / "m.db")["run"]["steps"] == 3
    out = memscope("attach", "--headless", "--db", "c.db", "--", sys.executable,
                   str(SCRIPTS / "loop.py"), "--steps", "4", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = report_json(tmp_path / "c.db")
    assert report["run"]["steps"] == 4 and report["run"]["command"][0] == sys.executable


def test_users_sitecustomize_still_runs(exit_3_with_user_site: Exit3) -> None:
    out, run_db, dump = exit_3_with_user_site  # the script's own exit status: 3
    assert out.returncode == 3, out.stderr
    with sqlite3.connect(run_db) as conn:
        (pid,) = conn.execute("SELECT pid FROM processes").fetchone()
    assert json.loads(dump.read_text())["sitecustomize_marker"] == str(pid)  # ran in the script's process
    assert report_json(run_db)["run"]["steps"] == 2  # and memscope's own bootstrap ran too


@pytest.mark.parametrize("spawn", [False, True])
def test_dataloader_workers_are_not_instrumented(run_db: Path, spawn: bool) -> None:
    # the fork arm also starts torch's Inductor compile-worker entry (on a GPU torch.compile
    # starts that pool with the training's environment): one process recorded, not two
    extra = ["--spawn"] if spawn else ["--inductor-worker"]
    out = attach(run_db, str(SCRIPTS / "loop.py"), "--mode", "backward", "--steps", "5",
                 "--workers", "2", *extra)
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(run_db) as conn:
        procs = conn.execute("SELECT status FROM processes").fetchall()
    assert procs == [("stopped",)]
    assert report_json(run_db)["run"]["steps"] == 5


def test_sigkilled_child_still_reports(run_db: Path) -> None:
    out = attach(run_db, str(SCRIPTS / "loop.py"), "--steps", "10", "--kill-self-at", "4")
    assert out.returncode == 128 + 9
    report = report_json(run_db)
    assert report["run"]["signal"] == 9 and report["run"]["exit_code"] is None
    assert report["run"]["steps"] == 4
    text = cli("report", str(run_db))
    assert "killed, signal 9" in text.stdout
    with sqlite3.connect(run_db) as conn:
        assert conn.execute("SELECT status FROM processes").fetchone()[0] == "lost"
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one self-contained file


def test_torchrun_ranks_recorded_not_the_launcher(tmp_path_factory: pytest.TempPathFactory) -> None:
    # 2 ranks of tests/scripts/ddp.py, 6 steps (rank 1 keeps a buffer alive): the run
    # tests/test_ranks.py reads, made once per session (tests/shared_runs.py)
    run_db, out = heavy_rank_run(tmp_path_factory)
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(run_db) as conn:
        rows = conn.execute(
            "SELECT rank, local_rank, world_size, status, (SELECT count(*) FROM steps s WHERE s.proc = p.id)"
            " FROM processes p ORDER BY rank").fetchall()
    assert rows == [(0, 0, 2, "stopped", 6), (1, 1, 2, "stopped", 6)]
    assert report_json(run_db)["run"]["steps"] == 6

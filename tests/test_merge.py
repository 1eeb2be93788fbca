"""``memscope merge``: two nodes simulated on loopback (two torchrun launches, --nnodes 2), each
under its own ``memscope attach --db nodeK.db``, combined into one run file."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SCRIPTS, cli, memscope, report_json
from memscope.store.schema import SCHEMA_VERSION
from conftest import free_port
from shared_runs import TORCHRUN, shared_attach
from test_diff import LEAK_ARGS, LEAK_OPTIONS

MiB = 2 ** 20


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """node0.db and node1.db of one 2-node x 1-process DDP run; global rank 1 is the heavy one."""
    if not TORCHRUN.exists():
        pytest.skip("torchrun not installed beside this Python")
    d = tmp_path_factory.mktemp("nodes")
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = []
    for k in (0, 1):
        cmd = [sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(d / f"node{k}.db"),
               "--", str(TORCHRUN), "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "1",
               "--master-addr", "127.0.0.1", "--master-port", str(port), str(SCRIPTS / "ddp.py"),
               "--steps", "4", "--heavy-rank", "1", "--heavy-mb", "128"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    return d / "node0.db", d / "node1.db"


def counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        # side_files: an input's records of its own spill files, never the output's (not copied)
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables
                if "proc" in [c[1] for c in conn.execute(f"PRAGMA table_info({t})")] and t != "side_files"}


def test_two_nodes_merge_into_one_report(nodes: tuple[Path, Path], tmp_path: Path) -> None:
    n0, n1 = nodes
    out = tmp_path / "all.db"
    res = memscope("merge", str(out), str(n0), str(n1))
    assert res.returncode == 0, res.stderr
    assert "2 processes from 2 run files" in res.stdout
    # every row of every proc table arrived, attributed to the right (renumbered) process
    c0, c1, cm = counts(n0), counts(n1), counts(out)
    for table in c0:
        expected = c0[table] + c1[table] + (1 if table == "events" else 0)  # + the 'merged' event
        assert cm[table] == expected, table
    with sqlite3.connect(out) as conn:
        procs = conn.execute("SELECT id, rank, local_rank, world_size FROM processes ORDER BY id").fetchall()
        assert procs == [(1, 0, 0, 2), (2, 1, 0, 2)]
        per_proc = dict(conn.execute("SELECT proc, count(*) FROM steps GROUP BY proc").fetchall())
        assert per_proc == {1: 4, 2: 4}
        run = conn.execute("SELECT started, ended, exit_code, status FROM run").fetchone()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    runs = []
    for n in nodes:
        with sqlite3.connect(n) as conn:
            runs.append(conn.execute("SELECT started, ended FROM run").fetchone())
    assert run == (min(r[0] for r in runs), max(r[1] for r in runs), 0, "finished")
    rep = report_json(out)
    assert [(r["rank"], r["steps"]) for r in rep["ranks"]] == [(0, 4), (1, 4)]
    assert rep["ranks"][1]["peak_bytes"] - rep["ranks"][0]["peak_bytes"] > 100 * MiB
    assert rep["rank_imbalance"] > 0.1
    text = cli("report", str(out)).stdout
    assert "ranks     2 processes" in text


def test_new_tables_with_proc_are_copied_and_exit_code_is_the_worst(nodes: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    shutil.copy(nodes[0], a)
    shutil.copy(nodes[1], b)
    for i, db in enumerate((a, b)):
        with sqlite3.connect(db) as conn:  # a table a later schema might add
            conn.execute("CREATE TABLE gpu_things (id INTEGER PRIMARY KEY, proc INTEGER NOT NULL, v INTEGER)")
            conn.execute("INSERT INTO gpu_things (proc, v) VALUES (1, ?)", (10 + i,))
            conn.execute("CREATE TABLE notes (text TEXT)")
    with sqlite3.connect(b) as conn:
        conn.execute("UPDATE run SET exit_code = 3, status = 'failed'")
    out = tmp_path / "m.db"
    res = memscope("merge", str(out), str(a), str(b))
    assert res.returncode == 0, res.stderr
    assert "notes" in res.stderr  # a table without proc is named, not silently dropped
    with sqlite3.connect(out) as conn:
        assert conn.execute("SELECT proc, v FROM gpu_things ORDER BY id").fetchall() == [(1, 10), (2, 11)]
        assert conn.execute("SELECT exit_code, status FROM run").fetchone() == (3, "failed")


def test_bad_inputs_are_refused_in_one_line(nodes: tuple[Path, Path], tmp_path: Path) -> None:
    n0, n1 = nodes
    out = tmp_path / "m.db"

    def refused(*args: str, says: str) -> None:
        res = memscope("merge", *args)
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
        assert says in res.stderr
        assert not out.exists()

    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    refused(str(out), str(n0), str(text), says="not a memscope run file")
    refused(str(out), str(n0), str(tmp_path / "missing.db"), says="no such file")
    refused(str(out), str(n0), str(n0), says="given twice")
    old = tmp_path / "old.db"
    shutil.copy(n1, old)
    with sqlite3.connect(old) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION - 1}")
    refused(str(out), str(n0), str(old), says="different schema versions")
    refused(str(out), str(n0), str(n0.parent / "node0.db"), says="given twice")
    # two files that both hold rank 0 are not nodes of one run
    twin = tmp_path / "twin.db"
    shutil.copy(n0, twin)
    refused(str(out), str(n0), str(twin), says="rank 0 is in both")
    # OUT exists: refused without --force; --force replaces only a run file or an empty file
    out.write_text("precious")
    res = memscope("merge", str(out), str(n0), str(n1))
    assert res.returncode == 2 and "--force" in res.stderr and out.read_text() == "precious"
    res = memscope("merge", str(out), str(n0), str(n1), "--force")
    assert res.returncode == 2 and "not a memscope run file" in res.stderr
    assert out.read_text() == "precious"
    out.write_text("")
    res = memscope("merge", str(out), str(n0), str(n1), "--force")
    assert res.returncode == 0, res.stderr
    res = memscope("merge", str(out), str(n0), str(n1), "--force")  # a run file: replaced
    assert res.returncode == 0, res.stderr
    assert report_json(out)["ranks"][1]["rank"] == 1
    res = memscope("merge", str(n0), str(n0), str(n1), "--force")
    assert res.returncode == 2 and "is also an input" in res.stderr
    assert report_json(n0)["run"]["steps"] == 4  # untouched


def _argv(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return list(json.loads(conn.execute("SELECT argv FROM processes").fetchone()[0]))


def _edited_copy(src: Path, dst: Path, *sql: str) -> Path:
    """A copy of a real node file with one fact changed, as another job's file would have it."""
    shutil.copy(src, dst)
    with sqlite3.connect(dst) as conn:
        for statement in sql:
            conn.execute(statement)
    return dst


def test_unrelated_runs_are_refused_by_default(nodes: tuple[Path, Path], tmp_path: Path,
                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two single-process runs of different scripts are not a 2-rank run; nor are node files of
    another world size, another program, or another time. Each: one line, exit 2, nothing written."""
    n0, n1 = nodes
    out = tmp_path / "m.db"
    # two single-process runs other tests make once per session (tests/shared_runs.py), only read
    # here: tiny_gpt (the dashboard's) and a leak example (tests/test_diff.py's)
    runs = [shared_attach(tmp_path_factory, [], ["examples/tiny_gpt.py", "--steps", "8"]),
            shared_attach(tmp_path_factory, LEAK_OPTIONS, ["examples/leaks/detached_list.py", *LEAK_ARGS])]
    assert all(res.returncode == 0 for _, res in runs), [res.stderr for _, res in runs]
    a, b = (db for db, _ in runs)

    def refused(*inputs: Path, says: str) -> None:
        res = memscope("merge", str(out), *map(str, inputs))
        assert res.returncode == 2, res.stdout + res.stderr
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.startswith("memscope: error: merge: ") and says in res.stderr, res.stderr
        assert "not the nodes of one job (--allow-unrelated merges them anyway)" in res.stderr
        assert res.stdout == "" and not out.exists()

    refused(a, b, says=f"{a} has no ranked process")
    refused(n0, a, says=f"{a} has no ranked process")  # a rank beside a plain run: still no
    four = _edited_copy(n1, tmp_path / "four.db", "UPDATE processes SET world_size = 4")
    refused(n0, four, says=f"different world sizes ({n0}: 2, {four}: 4)")
    argv = _argv(n1)
    assert argv[0].endswith("ddp.py") and "--steps" in argv
    other = _edited_copy(n1, tmp_path / "other.db", "UPDATE processes SET argv = '%s'"
                         % json.dumps(["other.py", *argv[1:]]))
    refused(n0, other, says=f"{n0} and {other} ran different commands "
                            f"({shlex.join(argv)} vs {shlex.join(['other.py', *argv[1:]])})")
    later = _edited_copy(n1, tmp_path / "later.db", "UPDATE run SET started = started + 3600, "
                         "ended = ended + 3600", "UPDATE processes SET started = started + 3600, "
                         "ended = ended + 3600")
    refused(n0, later, says=f"{later} started 35")  # ~3590 s after node0 ended
    refused(n0, later, says="did not overlap in time")
    # the override merges what a user says belongs together; a rank in two files never
    res = memscope("merge", str(out), str(a), str(b), "--allow-unrelated")
    assert res.returncode == 0, res.stderr
    assert "2 processes from 2 run files" in res.stdout
    assert report_json(out)["run"]["status"] == "finished"
    twin = tmp_path / "twin.db"
    shutil.copy(n0, twin)
    res = memscope("merge", str(tmp_path / "t.db"), str(n0), str(twin), "--allow-unrelated")
    assert res.returncode == 2 and "rank 0 is in both" in res.stderr


def test_ranks_of_one_job_merge_with_what_is_missing_said(nodes: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    n0, n1 = nodes
    # one node of two: merged, and the missing rank is named
    res = memscope("merge", str(tmp_path / "half.db"), str(n1))
    assert res.returncode == 0, res.stderr
    assert res.stderr == "memscope: note: ranks not in the inputs: 0\n"
    # a node whose clock runs a few seconds ahead is still the same job
    ahead = _edited_copy(n1, tmp_path / "ahead.db", "UPDATE run SET started = started + 5, ended = ended + 5")
    # a legacy launcher's per-rank --local-rank argument is not a different command
    argv = _argv(n0)
    legacy = _edited_copy(n0, tmp_path / "legacy.db", "UPDATE processes SET argv = '%s'"
                          % json.dumps([argv[0], "--local-rank=0", *argv[1:]]))
    res = memscope("merge", str(tmp_path / "all.db"), str(legacy), str(ahead))
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    assert [r["rank"] for r in report_json(tmp_path / "all.db")["ranks"]] == [0, 1]


def test_missing_ranks_are_said_as_ranges() -> None:
    from memscope.cli.merge import _ranges

    assert _ranges([0]) == "0"
    assert _ranges([2, 3, 4, 7, 9, 10]) == "2-4, 7, 9-10"

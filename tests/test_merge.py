"""``memscope merge``: two nodes simulated on loopback (two torchrun launches, --nnodes 2), each
under its own ``memscope attach --db nodeK.db``, combined into one run file."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SCRIPTS, memscope, report_json
from memscope.store.schema import SCHEMA_VERSION
from conftest import free_port
from test_ranks import TORCHRUN

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
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables
                if "proc" in [c[1] for c in conn.execute(f"PRAGMA table_info({t})")]}


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
    text = memscope("report", str(out)).stdout
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

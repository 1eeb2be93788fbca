"""``memscope export``: Chrome trace and CSV from real recorded runs (a CPU OOM, a 2-rank torchrun)."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import memscope
from shared_runs import shared_ddp


@pytest.fixture(scope="module")
def oom_run(oom_example_run: Path) -> Path:
    """A real run: 3 completed steps, then a CPU allocator OOM in the forward of step 3."""
    return oom_example_run


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks of tests/scripts/ddp.py, 3 steps (rank 1 holds 64 MiB more): the dashboard's
    run, made once per session (tests/shared_runs.py), read here and by tests/test_html.py."""
    db, out = shared_ddp(tmp_path_factory, "--steps", "3", "--heavy-rank", "1", "--heavy-mb", "64")
    assert out.returncode == 0, out.stderr
    return db


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def export_chrome(db: Path, tmp_path: Path) -> dict[str, Any]:
    trace = tmp_path / "trace.json"
    out = memscope("export", str(db), "--chrome", str(trace))
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    assert f"chrome trace: {trace}" in out.stderr
    return json.loads(trace.read_text())  # valid JSON, or this fails


def check_trace_format(doc: dict[str, Any]) -> None:
    """What the Trace Event Format requires of each event kind we write."""
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] == "ms"
    for ev in doc["traceEvents"]:
        assert ev["ph"] in {"M", "C", "X", "i"}, ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int), ev
        assert isinstance(ev["name"], str) and ev["name"], ev
        if ev["ph"] != "M":
            assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0, ev
        if ev["ph"] == "C":  # counter values must be numbers
            assert ev["args"] and all(isinstance(v, int) for v in ev["args"].values()), ev
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0, ev
        if ev["ph"] == "i":
            assert ev["s"] in {"g", "p", "t"}, ev


def test_chrome_trace_of_an_oom_run(oom_run: Path, tmp_path: Path) -> None:
    doc = export_chrome(oom_run, tmp_path)
    check_trace_format(doc)
    events = doc["traceEvents"]
    (proc_id, pid, started), = rows(oom_run, "SELECT p.id, p.pid, r.started FROM processes p, run r")

    names = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert [(e["pid"], e["args"]["name"].split(" · ")[0]) for e in names] == [(proc_id, f"pid {pid}")]

    # one counter event per RSS sample, values and microsecond timestamps straight from the file
    samples = rows(oom_run, "SELECT t, rss FROM samples ORDER BY t")
    counters = [e for e in events if e["ph"] == "C" and e["name"] == "host RSS"]
    assert len(samples) >= 3
    assert [(e["ts"], e["args"]["rss"]) for e in counters] == \
        [(round((t - started) * 1e6, 3), rss) for t, rss in samples]

    # step spans: 3 completed steps and the failed step 3, end = ts + dur in microseconds
    steps = rows(oom_run, "SELECT step, start, end, status FROM steps ORDER BY step")
    spans = [e for e in events if e["ph"] == "X"]
    assert [s[0] for s in steps] == [0, 1, 2, 3] and steps[-1][3] == "failed"
    assert [(e["name"], e["args"]["status"]) for e in spans] == \
        [(f"step {n}", status) for n, _, _, status in steps]
    for e, (_, start, end, _) in zip(spans, steps):
        assert e["tid"] == 1 and e["pid"] == proc_id
        assert e["ts"] == pytest.approx((start - started) * 1e6, abs=0.01)
        assert e["ts"] + e["dur"] == pytest.approx((end - started) * 1e6, abs=0.01)

    ooms = [e for e in events if e["ph"] == "i" and e["cat"] == "oom"]
    assert len(ooms) == 1
    assert ooms[0]["name"] == "OOM in forward (expand)"
    assert ooms[0]["pid"] == proc_id and ooms[0]["s"] == "p" and ooms[0]["args"]["step"] == 3
    # the OOM happened inside the failed step's span
    assert spans[-1]["ts"] <= ooms[0]["ts"] <= spans[-1]["ts"] + spans[-1]["dur"] + 1


def test_chrome_trace_one_process_per_rank(ddp_run: Path, tmp_path: Path) -> None:
    doc = export_chrome(ddp_run, tmp_path)
    check_trace_format(doc)
    events = doc["traceEvents"]
    procs = rows(ddp_run, "SELECT id, rank FROM processes ORDER BY rank")
    assert [r for _, r in procs] == [0, 1]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert {pid: name.split(" · ")[0] for pid, name in names.items()} == \
        {pid: f"rank {rank}" for pid, rank in procs}
    sort = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    assert sort == {pid: rank for pid, rank in procs}
    for pid, _ in procs:
        spans = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
        assert [e["args"]["step"] for e in spans] == [0, 1, 2]
        n = rows(ddp_run, f"SELECT count(*) FROM samples WHERE proc = {pid}")[0][0]
        assert n > 0
        assert sum(1 for e in events if e["ph"] == "C" and e["pid"] == pid) == n


def test_csv_timeline_file(oom_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "timeline.csv"
    out = memscope("export", str(oom_run), "--csv", str(target))
    assert out.returncode == 0, out.stderr
    with target.open(newline="") as f:
        table = list(csv.DictReader(f))
    samples = rows(oom_run, "SELECT t, step, phase, rss FROM samples ORDER BY t")
    assert [(float(r["unix_time"]), int(r["step"]), r["phase"], int(r["bytes"])) for r in table] == \
        [(pytest.approx(t, abs=1e-6), step, phase, rss) for t, step, phase, rss in samples]
    assert {(r["metric"], r["device"], r["rank"]) for r in table} == {("rss", "host", "")}


def test_csv_timeline_to_stdout(oom_run: Path) -> None:
    out = memscope("export", str(oom_run), "--csv", "-")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "rank,proc,time_s,unix_time,step,phase,metric,device,bytes"
    assert len(lines) - 1 == rows(oom_run, "SELECT count(*) FROM samples")[0][0]


def test_csv_directory_has_every_table(ddp_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "csv"  # created by the export
    out = memscope("export", str(ddp_run), "--csv", str(target) + "/")
    assert out.returncode == 0, out.stderr
    assert f"csv: {target}/ (" in out.stderr and "//" not in out.stderr
    tables = {r[0] for r in rows(ddp_run, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {p.name for p in target.iterdir()} == {f"{t}.csv" for t in tables - {"migrations"}} | {"timeline.csv"}
    with (target / "steps.csv").open(newline="") as f:
        steps = [(int(r["proc"]), int(r["step"]), int(r["peak_rss"])) for r in csv.DictReader(f)]
    assert sorted(steps) == sorted(rows(ddp_run, "SELECT proc, step, peak_rss FROM steps"))
    with (target / "timeline.csv").open(newline="") as f:
        ranks = {(r["rank"], r["proc"]) for r in csv.DictReader(f)}
    assert ranks == {(str(rank), str(pid)) for pid, rank in rows(ddp_run, "SELECT id, rank FROM processes")}


@pytest.mark.parametrize("args, message", [
    ([], "nothing to do"),
    (["--chrome", "/no/such/dir/trace.json"], "directory /no/such/dir does not exist"),
    (["--csv", "/no/such/dir/out"], "directory /no/such/dir does not exist"),
    (["--chrome", "-", "--csv", "-"], "cannot both write to stdout"),
])
def test_export_bad_arguments(oom_run: Path, args: list[str], message: str) -> None:
    out = memscope("export", str(oom_run), *args)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and message in out.stderr and "Traceback" not in out.stderr


def test_export_not_a_run_file(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.db"
    bogus.write_text("not sqlite at all, just text " * 50)
    out = memscope("export", str(bogus), "--chrome", str(tmp_path / "t.json"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "t.json").exists()


def test_export_csv_onto_a_plain_file(oom_run: Path, tmp_path: Path) -> None:
    plain = tmp_path / "data"
    plain.write_text("mine")
    out = memscope("export", str(oom_run), "--csv", str(plain))
    assert out.returncode == 2 and "not a directory" in out.stderr
    assert plain.read_text() == "mine"

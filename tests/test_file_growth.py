"""Run files sized by time (issue #21 part 4): uneventful steps of a long run are folded into
per-window rows, and every number a reader shows stays what it was.

Real attached trainings, real run files. The fold's thresholds are made small (module values for
an offline fold of a copy, environment variables for the writer inside an attached run) so a run
of a few hundred steps folds."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from memscope.store import fold
from conftest import EXAMPLES, SCRIPTS, cli, memscope, report_json

UNFOLDED = {"MEMSCOPE_FOLD_AFTER": str(10 ** 12)}


def _kept(db: Path) -> set[int]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT step FROM steps")}


def _windows(db: Path) -> list[tuple[int, int, int]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT first_step, last_step, steps FROM step_windows ORDER BY first_step").fetchall()


def _markers(db: Path) -> tuple[set[int], set[int]]:
    """(steps whose neighbours must stay: inventories, events, leak searches; profiled steps)"""
    with sqlite3.connect(db) as conn:
        near = {r[0] for t in ("inventories", "events", "leak_holders")
                for r in conn.execute(f"SELECT step FROM {t} WHERE step IS NOT NULL")}
        profiled = {r[0] for r in conn.execute("SELECT step FROM step_breakdown")}
    return near, profiled


def _check_kept(db: Path, steps: int, after: int, tail: int) -> None:
    kept, windows = _kept(db), _windows(db)
    assert windows, "nothing was folded"
    folded = [s for first, last, _ in windows for s in range(first, last + 1)]
    # a window is a run of consecutive steps, counted exactly, none of them also kept
    assert all(n == last - first + 1 >= 2 for first, last, n in windows)
    assert not kept & set(folded)
    assert sorted(kept | set(folded)) == list(range(steps))
    near, profiled = _markers(db)
    must = ({s + d for s in near for d in range(-fold.NEAR, fold.NEAR + 1)} | profiled
            | set(range(after)) | set(range(steps - tail, steps)))
    assert must & set(range(steps)) <= kept


def _same_report(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["run"]["steps"] == b["run"]["steps"]
    assert (a["peak"]["bytes"], a["peak"]["step"]) == (b["peak"]["bytes"], b["peak"]["step"])
    for key in ("leaks", "leak_check", "hotspots", "suggestions", "oom"):
        assert a[key] == b[key], key


@pytest.mark.parametrize("script, args, near", [
    # a leak: memory rises every step and pulls inventories forward (every third step here), so
    # only the marked steps themselves stay (NEAR 0) for anything to fold
    ("leaky", [str(EXAMPLES / "leaky.py"), "--steps", "160", "--width", "128"], 0),
    # a flat run whose memory spikes once at step 70, no inventories: only the peak rule keeps
    # it; profiled every 5th step, all in one wall-time bucket: only those nearest the peak stay
    ("spike", ["--inventory-every", "0", "--layers-every", "5", str(SCRIPTS / "spike.py"), "--steps", "160"],
     fold.NEAR),
])
def test_offline_fold_of_a_real_run_keeps_what_readers_show(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            script: str, args: list[str], near: int) -> None:
    """A real run's unfolded file, folded: same steps, peak and its step, leaks, advice."""
    whole = tmp_path / "whole.db"
    out = memscope("attach", "--headless", "--db", str(whole), *args, env=UNFOLDED, timeout=600)
    assert out.returncode == 0, out.stderr
    before = report_json(whole)
    assert before["run"]["steps"] == 160
    if script == "leaky":
        assert before["leaks"]
    else:
        assert before["peak"]["step"] == 70
    folded = tmp_path / "folded.db"
    shutil.copy(whole, folded)
    monkeypatch.setattr(fold, "FOLD_AFTER", 20)
    monkeypatch.setattr(fold, "TAIL", 16)
    monkeypatch.setattr(fold, "WINDOW_S", 1e9)  # windows end only at kept steps
    monkeypatch.setattr(fold, "NEAR", near)
    monkeypatch.setattr(fold, "PROFILE_EVERY_S", 1e9)
    with sqlite3.connect(folded, isolation_level=None) as conn:
        proc = conn.execute("SELECT id FROM processes").fetchone()[0]
        state = fold.FoldState()
        n = fold.fold(conn, proc, state)
        assert fold.fold(conn, proc, state) == 0  # nothing new: a second fold changes nothing
    assert n == state.folded == sum(w[2] for w in _windows(folded)) == 160 - len(_kept(folded))
    _check_kept(folded, 160, 20, 16)
    if script == "spike":  # profiles 21..141 in range: the first, the two around step 70, the last
        assert state.thinned > 10
        assert {21, 66, 71, 141} <= _markers(folded)[1]
    after = report_json(folded)
    _same_report(before, after)
    assert after["peak"]["step"] in _kept(folded)


def test_attached_run_folds_and_reports_every_step(tmp_path: Path) -> None:
    """The writer folds during the run (small thresholds from the environment); the report
    counts every step the script ran, and the steps readers look at stay whole."""
    db = tmp_path / "run.db"
    env = {"MEMSCOPE_FOLD_AFTER": "30", "MEMSCOPE_FOLD_EVERY_S": "0.1", "MEMSCOPE_FOLD_WINDOW_S": "1e9",
           "MEMSCOPE_FOLD_TAIL": "60"}
    out = memscope("attach", "--headless", "--db", str(db), "--inventory-every", "40", "--inventory-budget",
                   "0", str(SCRIPTS / "loop.py"), "--steps", "300",
                   env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "300 steps" in out.stderr + out.stdout
    assert report_json(db)["run"]["steps"] == 300
    _check_kept(db, 300, 30, 60)
    text = cli("report", str(db))
    assert text.returncode == 0 and "300 completed" in text.stdout
    # the Chrome trace shows every step: kept ones as step spans, folded ones as window spans
    trace = tmp_path / "trace.json"
    assert memscope("export", str(db), "--chrome", str(trace)).returncode == 0
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "step"]
    assert sum(e["args"].get("steps", 1) for e in spans) == 300
    assert sum(e["args"]["status"] == "folded" for e in spans) == len(_windows(db))
    for args in (["report", "--html", str(tmp_path / "r.html")], ["leaks"], ["layers"],
                 ["export", "--csv", str(tmp_path / "csv")]):  # every reader opens a folded file
        done = memscope(args[0], str(db), *args[1:])
        assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr)


def test_old_run_file_reads_without_windows(tmp_path: Path) -> None:
    """A schema-8 file (no step_windows table) still reads: nothing folded."""
    from memscope.store.reader import RunReader
    from memscope.store.schema import MIGRATIONS, _split_statements

    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA application_id = 1296387411")
    for script in MIGRATIONS[:8]:
        for statement in _split_statements(script):
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 8")
    conn.execute("INSERT INTO run (id, command, started, status) VALUES (1, '[]', 1.0, 'finished')")
    conn.execute("INSERT INTO processes (id, pid, started, status) VALUES (1, 1, 1.0, 'stopped')")
    conn.execute("INSERT INTO steps (proc, step, start, end) VALUES (1, 0, 1.0, 2.0)")
    conn.close()
    with RunReader(db) as reader:
        assert reader.version == 8
        assert reader.step_windows() == [] and reader.folded_steps() == {}
    assert report_json(db)["run"]["steps"] == 1

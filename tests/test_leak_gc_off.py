"""A script that disables or freezes the garbage collector: the registry of live tensors is fed by
collections, so each inventory walks more; inventories go on (spaced by the time budget) and the
leak is found, and when the budget spaced them far from the end the report says why."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from conftest import SCRIPTS, cli, memscope, report_json
from memscope.analysis.leaks import LeakCheck


@pytest.mark.parametrize("mode,words", [("disable", "gc.disable()"), ("freeze", "gc.freeze()")])
def test_gc_off_is_seen_and_said(tmp_path: Path, mode: str, words: str) -> None:
    db = tmp_path / "run.db"
    # 120 steps: with the collector off each inventory walks more, and on a loaded machine the 1%
    # budget spaced 60 steps' inventories too far apart to show a trend (failed twice in full runs)
    out = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "gc_off_leak.py"), mode, "120")
    assert out.returncode == 0, out.stderr
    report = report_json(db)
    (lk,) = report["leaks"]
    assert lk["held_by"] == "__main__.kept" and lk["bytes_per_step"] == 16 * 64 * 4
    check = report["leak_check"]
    leaks_text = cli("leaks", str(db)).stdout
    behind = check["last_step"] - check["last_inventory_step"]
    if behind > 16:  # the budget spaced them out: the reason is given, with what to do
        assert f"the last tensor inventory was at step {check['last_inventory_step']} of 119" in leaks_text
        assert words in leaks_text and "--inventory-every N" in leaks_text
    else:
        assert "the last tensor inventory was at step" not in leaks_text
    with sqlite3.connect(db) as conn:
        said = [r[0] for r in conn.execute("SELECT message FROM events WHERE kind = 'gc_state'")]
    assert len(said) == 1 and words in said[0]


def test_collector_off_with_a_young_collection_by_hand_every_10_steps(tmp_path: Path) -> None:
    """torchtitan's way: each inventory looks past its mark, or at what the last collection left
    young: all of them cheap, so the cadence runs to the end as with the collector on."""
    db = tmp_path / "run.db"
    out = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "gc_off_leak.py"), "disable", "300",
                   "10")
    assert out.returncode == 0, out.stderr
    report = report_json(db)
    (lk,) = report["leaks"]
    assert lk["held_by"] == "__main__.kept" and lk["bytes_per_step"] == 16 * 64 * 4
    check = report["leak_check"]
    assert check["last_step"] - check["last_inventory_step"] <= 299 // 16
    assert "the last tensor inventory was at step" not in cli("leaks", str(db)).stdout


def test_coverage_line_only_when_inventories_stopped_far_from_the_end() -> None:
    def check(last_inv: int, last: int) -> LeakCheck:
        return LeakCheck(10, 4, last_inventory=last_inv, last_step=last, why_sparse="the script froze it")

    # the default schedule keeps the last inventory within ~1/16 of the run: never a note
    assert check(59, 59).coverage() is None and check(43, 59).coverage() is None
    assert check(9375, 9999).coverage() is None
    note = check(6, 59).coverage()
    assert note is not None and "step 6 of 59" in note and "the script froze it" in note
    assert check(8000, 9999).coverage() is not None
    assert LeakCheck(10, 4, off=True, last_inventory=0, last_step=500).coverage() is None

"""Leak verdicts at default options hold for the whole run, for every leak example (1,000 steps;
detached_list 5,000) and the clean example: what is checked is tests/leak_lengths.py's doc. The
leaks injected into a tiny GPT are tests/test_leak_lengths_gpt.py (a second file, so make test's
two workers run both halves side by side)."""

from __future__ import annotations

from pathlib import Path

import pytest

from leak_lengths import CASES, EXAMPLE_CASES, Run, check_verdicts, reported, run_of

@pytest.fixture(scope="module", params=EXAMPLE_CASES)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_of(request.param, tmp_path_factory)


def test_verdict_at_every_length(run: Run, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    check_verdicts(run, tmp_path, tmp_path_factory)


def test_detached_list_for_5000_steps(tmp_path_factory: pytest.TempPathFactory) -> None:
    case = CASES["detached_list"]
    run = run_of("detached_list", tmp_path_factory)  # the run test_verdict_at_every_length read
    assert case.steps == 5000
    # the interval is step // 16, stretched by the 1% budget on a busy machine (inventories are
    # charged their CPU time, which grows with contention). Last inventory measured: 4575-4701
    # alone, 4350-4398 beside one busy process, 4162 in one full suite run (2026-11-27): within
    # three intervals; the stretch under load is what to make smaller, not this bound
    assert run.inventory_steps[-1] >= 5000 - 3 * (5000 // 16)
    lk = reported(run, 4999)
    assert lk is not None and lk.site == case.site and lk.bytes_per_step == 32 * 256 * 4
    first = next(s for s in run.inventory_steps if reported(run, s) is not None)
    assert [s for s in run.inventory_steps if s >= first and reported(run, s) is None] == []

"""Leak verdicts at default options hold for the whole run, for the leaks injected into a tiny
GPT trained the way makemore / minGPT / ng-video-lecture train (tests/scripts/leaky_gpt.py, 400
steps), its clean run and the healthy patterns (400 steps): what is checked is
tests/leak_lengths.py's doc (the leak examples are tests/test_leak_lengths.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from leak_lengths import GPT_CASES, Run, check_verdicts, run_of


@pytest.fixture(scope="module", params=GPT_CASES)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_of(request.param, tmp_path_factory)


def test_verdict_at_every_length(run: Run, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    check_verdicts(run, tmp_path, tmp_path_factory)

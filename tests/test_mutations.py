"""Kept mutation checks: a planted 1% error in a measurement makes the test that claims its
precision fail.

The three precise tests rerun in one fresh pytest with ``tests/mutants/sitecustomize.py`` first
on PYTHONPATH and ``TEST_MUTANT`` naming, for each test, the error to plant while it runs (the fake run's peak, the OOM
census's activations, the bytes a module saved for backward: each 1% high, in the process that
makes it; the fake peak where the runner reads it). The test must then fail on an assertion, and the mutant's
log must show the error was planted (a test that failed for another reason proves nothing). The
same tests pass unplanted in the suite itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from xml.etree import ElementTree

import pytest

from conftest import ROOT

MUTANTS = ROOT / "tests" / "mutants"
CASES = {
    "fake_peak": "tests/test_fake_estimate.py::test_fake_peak_is_the_real_live_tensor_peak_to_the_byte[MLP-SGD-fp32]",
    "census_activations": "tests/test_oom_at_failure.py::"
                          "test_breakdown_at_failure_matches_an_independent_count[forward-forward-boom-unhandled]",
    "layer_bytes": "tests/test_layers.py::test_mlp_bytes_match_analytic_values",
}


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str], dict[str, str]]:
    """One fresh pytest running the three precise tests, each with its own mutant planted (the
    mutant fires only while its test runs: tests/mutants/sitecustomize.py): its output, the
    planted log, and each test's outcome with its failure message (from its JUnit XML)."""
    tmp = tmp_path_factory.mktemp("mutants")
    log, xml = tmp / "planted.log", tmp / "results.xml"
    env = dict(os.environ, TEST_MUTANT=",".join(f"{m}={test}" for m, test in sorted(CASES.items())),
               TEST_MUTANT_LOG=str(log), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(MUTANTS), os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "--basetemp", str(tmp / "base"), "--junitxml", str(xml), *CASES.values()],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    planted = log.read_text().split() if log.exists() else []
    outcomes = {}
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        failure = case.find("failure")
        if failure is not None:
            outcomes[name] = f"failed: {failure.get('message', '')} {failure.text or ''}"
        elif case.find("error") is not None or case.find("skipped") is not None:
            outcomes[name] = "not run"
        else:
            outcomes[name] = "passed"
    return out.stdout, planted, outcomes


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(CASES))
def test_a_planted_one_percent_error_fails_the_precise_test(planted_run: tuple[str, list[str], dict[str, str]],
                                                            mutant: str) -> None:
    stdout, planted, outcomes = planted_run
    assert mutant in planted, f"the mutant was never planted:\n{stdout[-3000:]}"
    outcome = outcomes.get(CASES[mutant], f"not in the results: {sorted(outcomes)}")
    assert outcome.startswith("failed: "), (outcome, stdout[-3000:])
    assert "AssertionError" in outcome or "assert " in outcome, outcome[-3000:]

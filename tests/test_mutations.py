"""Kept mutation checks: a planted 1% error in a measurement makes the test that claims its
precision fail.

Each case reruns one precise test in a fresh pytest with ``tests/mutants/sitecustomize.py`` first
on PYTHONPATH and ``TEST_MUTANT`` naming the error to plant (the fake run's peak, the OOM
census's activations, the bytes a module saved for backward: each 1% high, in the process that
makes it; the fake peak where the runner reads it). The test must then fail on an assertion, and the mutant's
log must show the error was planted (a test that failed for another reason proves nothing). The
same tests pass unplanted in the suite itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

MUTANTS = ROOT / "tests" / "mutants"
CASES = {
    "fake_peak": "tests/test_fake_estimate.py::test_fake_peak_is_the_real_live_tensor_peak_to_the_byte[MLP-SGD-fp32]",
    "census_activations": "tests/test_oom_at_failure.py::"
                          "test_breakdown_at_failure_matches_an_independent_count[forward-forward-boom-unhandled]",
    "layer_bytes": "tests/test_layers.py::test_mlp_bytes_match_analytic_values",
}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(CASES))
def test_a_planted_one_percent_error_fails_the_precise_test(tmp_path: Path, mutant: str) -> None:
    log = tmp_path / "planted.log"
    env = dict(os.environ, TEST_MUTANT=mutant, TEST_MUTANT_LOG=str(log),
               OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(MUTANTS), os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          "--basetemp", str(tmp_path / "base"), CASES[mutant]],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    planted = log.read_text().split() if log.exists() else []
    assert mutant in planted, f"the mutant was never planted:\n{out.stdout[-3000:]}"
    assert out.returncode == 1 and "1 failed" in out.stdout, out.stdout[-3000:]
    assert "AssertionError" in out.stdout or "assert " in out.stdout, out.stdout[-3000:]

"""Fixtures for the dashboard tests: real run files written by ``memscope attach``."""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import textual._wait

ROOT = Path(__file__).resolve().parents[2]

# Pilot's pause() (four in every click: mouse down, up, click, after) waits for the app to be idle
# by sleeping SLEEP_GRANULARITY at a time until one sleep passes with under SLEEP_IDLE of the
# process's CPU used. Textual's 20 ms made the dashboard tests mostly sleep (the hostile views'
# clicks on every row: 30.7 s alone, 14 s of it CPU). The same rule at 2 ms (idle: under 1/20 of
# it, Textual's own ratio), after the same wait for every queued message: 15.8 s, and the tests
# under tests/tui 143 -> 113 s alone (textual 8.2.8, pinned in pyproject's dev group).
textual._wait.SLEEP_GRANULARITY = 0.002
textual._wait.SLEEP_IDLE = textual._wait.SLEEP_GRANULARITY / 20

# tests/ and tests/tui/ are not packages, so pytest imports both conftest files under the one
# name "conftest" and the later one replaces the other in sys.modules. Test modules in tests/
# do `from conftest import ...`; re-export those helpers so that works whichever conftest is
# current (e.g. `pytest tests/tui tests/test_attach.py`). Hooks and fixtures are not re-exported.
_spec = importlib.util.spec_from_file_location("_memscope_tests_conftest", ROOT / "tests" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_top = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_top)
EXAMPLES: Path = _top.EXAMPLES
SCRIPTS: Path = _top.SCRIPTS
has_cuda = _top.has_cuda
memscope = _top.memscope
report_json = _top.report_json
free_port = _top.free_port
torchrun = _top.torchrun
shared_attach = _top.shared_attach
shared_ddp = _top.shared_ddp
cli = _top.cli
graph_malloc = _top.graph_malloc
forget_compiles = _top.forget_compiles


def _attach(db: Path, *command: str, ok: bool = True) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db),
                          *command], cwd=ROOT, env=env, check=ok, capture_output=True, text=True,
                         timeout=300)
    _recorded(db, out.stderr)


def _recorded(db: Path, stderr: str) -> None:
    """Fail here, with the agent's words, if the run recorded nothing to show."""
    conn = sqlite3.connect(db)
    try:
        samples = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
    finally:
        conn.close()
    assert samples > 0, stderr


def _shared(tmp_path_factory: pytest.TempPathFactory, *command: str, ok: bool = True) -> Path:
    """A run made once per session for both xdist workers (tests/shared_runs.py); ``command`` is
    attach's options, then the script (or ``--`` and a command) with its arguments."""
    split = next(i for i, arg in enumerate(command) if arg.endswith(".py") or arg == "--")
    db, out = shared_attach(tmp_path_factory, command[:split], command[split:])
    assert out.returncode == 0 or not ok, out.stderr
    _recorded(db, out.stderr)
    return db


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of examples/tiny_gpt.py (8 steps), shared by the dashboard tests."""
    return _shared(tmp_path_factory, "examples/tiny_gpt.py", "--steps", "8")


@pytest.fixture(scope="session")
def tiny_report(tiny_run: Path) -> dict[str, Any]:
    """``memscope report --json`` of :func:`tiny_run`: what the dashboard must agree with."""
    out = subprocess.run([sys.executable, "-m", "memscope", "report", str(tiny_run), "--json"],
                         cwd=ROOT, check=True, capture_output=True, text=True, timeout=120)
    report: dict[str, Any] = json.loads(out.stdout)
    return report


@pytest.fixture(scope="session")
def leaky_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/leaky.py (keeps every step's loss tensor): inventories every 2 steps, layers
    profiled at steps 1, 5, 9, 13."""
    return _shared(tmp_path_factory, "--inventory-every", "2", "--layers-every", "4", "examples/leaky.py",
                   "--steps", "16")


@pytest.fixture(scope="session")
def oom_run(oom_example_run: Path) -> Path:
    """examples/oom.py: a real allocator failure in the ``expand`` module at step 3 (the run the
    export tests read: tests/conftest.py)."""
    return oom_example_run


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks under torchrun (gloo on CPU); rank 1 holds an extra 64 MiB from its first step
    (the run tests/test_export.py and tests/test_html.py read too: tests/shared_runs.py)."""
    db, out = shared_ddp(tmp_path_factory, "--steps", "3", "--heavy-rank", "1", "--heavy-mb", "64")
    assert out.returncode == 0, out.stderr
    _recorded(db, out.stderr)
    return db


@pytest.fixture(scope="session")
def ddp_oom_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks under torchrun; rank 1 runs out of memory at step 2 (a real allocator failure;
    the run tests/test_ranks.py reads too)."""
    db, out = shared_ddp(tmp_path_factory, "--steps", "5", "--oom-rank", "1", "--oom-step", "2")
    _recorded(db, out.stderr)
    return db


@pytest.fixture(scope="session")
def peft_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/scripts/peft_names.py --leak: a LoRA GPT with peft-length module names
    (``base_model.model.transformer.h.0.attn.c_attn.lora_A.default``) that keeps every loss."""
    return _shared(tmp_path_factory, "--inventory-every", "2", "--layers-every", "2",
                   "tests/scripts/peft_names.py", "--steps", "10", "--leak")


@pytest.fixture(scope="session")
def peft_oom_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model running out of memory at step 4 in a long-named LoRA layer."""
    return _shared(tmp_path_factory, "tests/scripts/peft_names.py", "--steps", "10", "--oom-step", "4", ok=False)

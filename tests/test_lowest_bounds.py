"""The lower bounds pyproject.toml states for textual (the ``tui`` extra) and sqlite-utils are
tested, not guessed (issue 38): a fresh venv with torch (linked: tests/packaging_venvs.py) gets the
built wheel with exactly those versions, and pytest from that venv runs the reader and dashboard
tests below against them. An older textual than the bound is said in one line by ``memscope tui``.

The tests run from the checkout (tests/ and its data are not in the wheel) with the venv's
``pytest``, whose import path starts at the venv's bin/, so the memscope they import is the
installed wheel's; the commands they start as ``python -m memscope`` from the checkout's root
import the checkout's copy of the same code, with the venv's textual and sqlite-utils."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from packaging.version import Version

from packaging_venvs import clean_env, new_venv, pip, run, shared_build, venv_with_torch
from shared_runs import shared_dir
from tmux_pane import terminal

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = (ROOT / "pyproject.toml").read_text()

# the dashboard (Textual's Pilot, real run files: fixed ones and runs attached in the venv)
DASHBOARD = [
    "tests/tui/test_first_paint.py",
    "tests/tui/test_app.py::test_header_shows_the_run",
    "tests/tui/test_app.py::test_question_mark_shows_help",
    "tests/tui/test_app.py::test_unreadable_file_is_reported_not_fatal",
    "tests/tui/test_views.py::test_number_keys_switch_views",
    "tests/tui/test_views.py::test_leaks_show_the_verdict_and_the_diff",
    "tests/tui/test_layout.py::test_every_key_is_in_help",
]
# the readers: sqlite-utils' one use (RunReader.db), the report of a fixed run file, the head read
READERS = [
    "tests/test_store.py::test_reader_offers_the_file_to_sqlite_utils",
    "tests/test_leaks.py::test_v4_run_file_still_reads",
    "tests/test_run_head.py::test_head_matches_the_full_summary",
]


def lower_bound(name: str) -> str:
    """The ``NAME>=X`` pyproject.toml requires (the core's dependencies or the tui extra)."""
    published = PYPROJECT[:PYPROJECT.index("[dependency-groups]")]
    found = re.findall(rf'"{re.escape(name)}>=([0-9][^",;]*)"', published)
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


def dev_requirement(name: str) -> str:
    """The dev group's requirement for a test tool (the same pytest plugins as make test)."""
    group = PYPROJECT[PYPROJECT.index("[dependency-groups]"):]
    found = re.search(rf'^\s*"({re.escape(name)}[<>=!~][^"]*)"', group, re.M)
    assert found is not None, name
    return found.group(1)


@pytest.fixture(scope="module")
def lowest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, wheel = shared_build(shared_dir(tmp_path_factory))
    python, constraints = venv_with_torch(tmp_path_factory.mktemp("lowest") / "venv")
    pip(python, "install", "-q", "-c", str(constraints), str(wheel),
        f"textual=={lower_bound('textual')}", f"sqlite-utils=={lower_bound('sqlite-utils')}",
        *(dev_requirement(tool) for tool in ("pytest", "pytest-asyncio", "pytest-timeout")))
    return python


def test_the_reader_and_dashboard_tests_pass_with_the_lowest_bounds(lowest: Path, tmp_path: Path) -> None:
    versions = run(lowest, "python", "-c", "from importlib.metadata import version as v; "
                   "print(v('textual'), v('sqlite-utils'))", cwd=tmp_path).stdout.split()
    assert [Version(v) for v in versions] == [Version(lower_bound("textual")), Version(lower_bound("sqlite-utils"))]
    # --basetemp: its own (pytest would otherwise prune other sessions' numbered directories)
    res = run(lowest, "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "inner"),
              *DASHBOARD, *READERS, cwd=ROOT, timeout=540)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    print(res.stdout.splitlines()[-1])
    assert re.search(r"^(\d+) passed", res.stdout.splitlines()[-1]), res.stdout[-2000:]
    assert "skipped" not in res.stdout.splitlines()[-1], res.stdout[-2000:]


def test_an_older_textual_is_named_with_the_install_command(tmp_path: Path,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """The newest textual below the bound, in a venv of the wheel alone (--no-deps: the check
    runs before the dashboard imports anything), in a real terminal (tmux)."""
    _, wheel = shared_build(shared_dir(tmp_path_factory))
    low = lower_bound("textual")
    python = new_venv(tmp_path / "venv")
    pip(python, "install", "-q", "--no-deps", str(wheel), f"textual<{low}")
    older = run(python, "python", "-c", "from importlib.metadata import version; print(version('textual'))",
                cwd=tmp_path).stdout.strip()
    shutil.copy(ROOT / "tests" / "tui" / "data" / "leaky.sqlite", tmp_path / "leaky.db")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in clean_env().items() if k in ("PATH", "HOME", "LANG", "TERM"))
    with terminal() as pane:
        pane.start(f"cd {shlex.quote(str(tmp_path))} && env -i {env} {shlex.quote(str(python.parent / 'memscope'))} "
                   "tui leaky.db; echo TUI_EXIT=$?; sleep 600")
        pane.wait_for(lambda s: "TUI_EXIT=" in s, what="memscope tui to end")
        screen = pane.tmux("capture-pane", "-p", "-J", "-t", "t")
    assert (f'memscope: error: the dashboard needs textual>={low}, and textual {older} is installed: '
            'pip install "torch-memscope[tui]"\nTUI_EXIT=2\n') in screen

"""memscope installed where torch is not (issue 38): a venv with torch-memscope's wheel and its
requirements from the package index, and no torch. ``memscope attach`` runs the script (its
traceback and exit status are the script's) and says in one line that torch is not installed in
the interpreter that ran it, naming that interpreter; ``memscope.start()`` raises one clear error;
reading a run file needs no torch; the dashboard without textual names the command that installs
it."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from packaging_venvs import clean_env, new_venv, pip, run, shared_build
from shared_runs import shared_dir
from tmux_pane import terminal

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parent.parent
LEAKY = ROOT / "tests" / "tui" / "data" / "leaky.sqlite"  # a fixed run file (tests/tui/data/README.md)


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's interpreter: the wheel, its requirements, no torch and no textual."""
    _, wheel = shared_build(shared_dir(tmp_path_factory))
    exe = new_venv(tmp_path_factory.mktemp("without-torch") / "venv")
    pip(exe, "install", "-q", str(wheel))
    probe = run(exe, "python", "-c", "import importlib.util as u; print(u.find_spec('torch'), u.find_spec('textual'))",
                cwd=tmp_path_factory.getbasetemp())
    assert probe.stdout.split() == ["None", "None"], probe  # the premise: neither is importable
    return exe


def test_attach_says_torch_is_not_installed_in_the_scripts_interpreter(python: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('the script starts')\nimport torch\n")
    db = tmp_path / "run.db"
    res = run(python, "memscope", "attach", "--headless", "--db", str(db), str(script), cwd=tmp_path)
    assert res.returncode == 1, res.stderr  # the script's own failure, passed through
    assert "the script starts" in res.stdout
    # the script's traceback is the script's: kept as it is
    assert "Traceback" in res.stderr and "ModuleNotFoundError: No module named 'torch'" in res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("memscope: ")]
    why = f"memscope: recording empty: torch is not installed in {python}, the Python that ran the script"
    assert [line for line in said if "recording empty" in line] == [line for line in said if line.startswith(why)]
    assert len([line for line in said if line.startswith(why)]) == 1, res.stderr
    assert f"{python} -m pip install torch" in res.stderr
    assert "agent started in no process" not in res.stderr  # the generic guess is not said
    report = run(python, "memscope", "report", str(db), "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert f"torch is not installed in {python}" in report.stdout and '"exit_code": 1' in report.stdout


def test_the_scripts_exit_status_passes_through(python: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\ntry:\n    import torch\nexcept ImportError:\n    sys.exit(3)\n")
    res = run(python, "memscope", "attach", "--headless", "--db", str(tmp_path / "run.db"), str(script),
              cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert f"recording empty: torch is not installed in {python}" in res.stderr
    assert "Traceback" not in res.stderr


API = """
import sys
import memscope
from memscope.errors import TorchMissing
memscope.stop()  # nothing started: nothing to stop, and no torch to import for it
memscope.step()
for call in (lambda: memscope.start("run.db"), lambda: memscope.profile("run.db")):
    try:
        call()
    except TorchMissing as exc:
        assert isinstance(exc, ImportError)  # what code that caught the old error still catches
        print(exc)
    else:
        raise SystemExit("no error")
"""


def test_start_and_profile_raise_one_clear_error(python: Path, tmp_path: Path) -> None:
    res = run(python, "python", "-c", API, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    start, profile = res.stdout.splitlines()
    assert start == (f"memscope.start() records PyTorch training, and torch is not installed in {python}: "
                     f"install it there ({python} -m pip install torch); reading run files "
                     "(memscope.load, memscope report) works without it")
    assert profile.startswith("memscope.profile() records PyTorch training")
    assert not (tmp_path / "run.db").exists()


def test_a_run_file_reads_without_torch(python: Path, tmp_path: Path) -> None:
    db = tmp_path / "leaky.db"
    shutil.copy(LEAKY, db)
    res = run(python, "memscope", "leaks", str(db), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "LEAK" in res.stdout
    code = (f"import sys, memscope\nr = memscope.load({str(db)!r}).report()\n"
            "assert r['leaks'] and 'torch' not in sys.modules\nprint('read')")
    res = run(python, "python", "-c", code, cwd=tmp_path)
    assert res.stdout.strip() == "read", res.stderr


def test_the_dashboard_without_textual_names_the_install_command(python: Path, tmp_path: Path) -> None:
    """In a real terminal (tmux), where the dashboard would start: ``memscope tui`` refuses in one
    line, and ``attach`` says the same (a warning: -q keeps it) and records headless."""
    db = tmp_path / "leaky.db"
    shutil.copy(LEAKY, db)
    script = tmp_path / "train.py"
    script.write_text("print('no torch here')\n")
    memscope = shlex.quote(str(python.parent / "memscope"))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in clean_env().items() if k in ("PATH", "HOME", "LANG", "TERM"))
    with terminal() as pane:
        pane.start(f"cd {shlex.quote(str(tmp_path))} && env -i {env} {memscope} tui leaky.db; echo TUI_EXIT=$?; "
                   f"env -i {env} {memscope} attach -q --db run.db train.py; echo ATTACH_EXIT=$?; sleep 600")
        pane.wait_for(lambda s: "ATTACH_EXIT=" in s, what="both commands to end")
        lines = pane.tmux("capture-pane", "-p", "-J", "-t", "t")  # -J: wrapped lines joined again
    install = 'pip install "torch-memscope[tui]"'
    assert f"memscope: error: the dashboard is not installed (it needs textual): {install}\nTUI_EXIT=2\n" in lines
    assert f"memscope: the dashboard is not installed (it needs textual): {install}; running headless" in lines
    assert "no torch here" in lines and "ATTACH_EXIT=0" in lines

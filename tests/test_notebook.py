"""memscope in a real Jupyter kernel (nbclient + ipykernel): profile a training in a cell, run the
cell again, read the run back with memscope.load and draw it inline, start while recording, a
missing file. One kernel for the whole file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat", reason="pip install nbformat nbclient ipykernel (dev group: make install)")
nbclient = pytest.importorskip("nbclient", reason="pip install nbclient ipykernel (dev group: make install)")

TRAIN = """
import memscope, torch
kept = []
def train(steps):
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(32, 64)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        kept.append(loss)  # the leak: every step's loss, with its graph
"""
PROFILE = """
with memscope.profile("nb.db", name="baseline", inventory_every=1) as rec:
    train(10)
rec
"""
CELLS = [
    TRAIN,
    PROFILE,
    PROFILE,  # the same cell run again
    'run = memscope.load("nb.db")\nrun',
    'again = memscope.load()\nprint(again.path, again.name, len(run.leaks()), run.report()["run"]["steps"])',
    'a = memscope.start("a.db")\nb = memscope.start("b.db")\nprint(a is b, a.db)\nmemscope.stop()',
    'd = memscope.start()\nmemscope.stop()\nr = memscope.load(d.db)\n'
    'print(os.path.basename(d.db), r.name, r.report()["run"]["command"])',
    'memscope.load("missing.db")',
]


def _text(outputs: list[Any], stream: str) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == stream)


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    where = tmp_path_factory.mktemp("notebook")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import os\n" + c if i == 0 else c) for i, c in enumerate(CELLS)]
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=240, allow_errors=True,
                                     resources={"metadata": {"path": str(where)}})
    client.execute()
    return nb, where


def test_profile_in_a_cell_shows_the_recording(executed: tuple[Any, Path]) -> None:
    nb, where = executed
    first = nb.cells[1].outputs
    assert not [o for o in first if o["output_type"] == "error"], first
    (shown,) = [o for o in first if o["output_type"] == "execute_result"]
    assert shown["data"]["text/plain"] == "<memscope stopped into 'nb.db'; memscope.load('nb.db') reads it>"
    assert (where / "nb.db").exists()


def test_the_same_cell_again_records_into_a_new_file_in_one_line(executed: tuple[Any, Path]) -> None:
    nb, where = executed
    again = nb.cells[2].outputs
    assert not [o for o in again if o["output_type"] == "error"], again  # no traceback
    assert _text(again, "stderr") == "memscope: nb.db holds this session's earlier run: recording into nb-2.db\n"
    assert (where / "nb-2.db").exists()
    (shown,) = [o for o in again if o["output_type"] == "execute_result"]
    assert "'nb-2.db'" in shown["data"]["text/plain"]


def test_load_draws_the_run_inline(executed: tuple[Any, Path]) -> None:
    nb, _ = executed
    (shown,) = [o for o in nb.cells[3].outputs if o["output_type"] == "execute_result"]
    page = shown["data"]["text/html"]
    assert page.startswith('<div class="memscope-run"><style>') and page.endswith("</script></div>")
    assert "baseline · " in page  # the name given to profile()
    for chart in ('id="timeline"', 'id="categories"', 'id="leak-1"'):
        assert chart in page, chart
    assert page.count("data-tip=") > 10
    # the styles stay inside the output: every rule is under the run's own class
    style = page.split("<style>", 1)[1].split("</style>", 1)[0]
    rules = [r.split("{", 1)[0] for r in style.replace("}}", "}").split("}") if "{" in r]
    assert all(sel.strip().startswith((".memscope-run", "@media")) for r in rules for sel in r.split(",")), rules
    assert "'nb.db': finished, 10 steps" in shown["data"]["text/plain"] and "1 leak(s)" in shown["data"]["text/plain"]


def test_load_reads_the_last_run_and_its_contract(executed: tuple[Any, Path]) -> None:
    nb, where = executed
    out = _text(nb.cells[4].outputs, "stdout")
    assert out == f"{where / 'nb-2.db'} baseline 1 10\n", out


def test_start_while_recording_says_which_file(executed: tuple[Any, Path]) -> None:
    nb, where = executed
    outs = nb.cells[5].outputs
    assert _text(outs, "stderr") == ("memscope: warning: already recording into a.db; b.db was not started "
                                     "(memscope.stop() first to record into another file)\n")
    assert _text(outs, "stdout") == "True a.db\n"
    assert not (where / "b.db").exists()


def test_a_kernel_run_is_named_after_the_notebook(executed: tuple[Any, Path]) -> None:
    nb, _ = executed
    name, run_name, command = _text(nb.cells[6].outputs, "stdout").split(" ", 2)
    assert name.startswith("memscope-notebook-") and name.endswith(".db"), name
    assert run_name == "notebook"
    assert "ipykernel_launcher" in command and ".json" not in command and "-f" not in json.loads(
        command.replace("'", '"'))


def test_a_missing_file_is_one_line(executed: tuple[Any, Path]) -> None:
    nb, _ = executed
    (err,) = [o for o in nb.cells[7].outputs if o["output_type"] == "error"]
    assert err["traceback"] == ["memscope: error: missing.db: no such file"], err["traceback"]
    assert os.path.basename(err["ename"]) == "LoadError"


def test_reading_a_run_imports_no_torch(tmp_path: Path) -> None:
    """A run file copied to a laptop without torch: memscope.load reads and draws it (a fresh
    interpreter; the fixed dashboard run file)."""
    import subprocess
    import sys

    run = Path(__file__).parent / "tui" / "data" / "leaky.sqlite"
    code = ("import sys, memscope\n"
            f"r = memscope.load({str(run)!r})\n"
            "assert r.report()['schema'] == 'memscope.report/1' and r.leaks() and r.layers()['modules']\n"
            "assert r.timeline().leaks and 'id=\"leak-1\"' in r._repr_html_()\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "[]\n", out.stderr

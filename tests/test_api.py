"""The Python API in this very process: memscope.start/step/stop/profile on a real loop."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import memscope  # noqa: E402
from memscope.analysis.summary import summarize  # noqa: E402
from memscope.store.reader import RunReader  # noqa: E402


def train(steps: int, refs: list[weakref.ref] | None = None, manual: bool = False) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters())
    for _ in range(steps):
        x = torch.randn(8, 16)
        out = model(x)
        loss = out.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if manual:
            memscope.step()
        if refs is not None:
            refs += [weakref.ref(x), weakref.ref(out), weakref.ref(loss)]


def test_profile_records_steps_and_removes_its_hooks(tmp_path: Path) -> None:
    db = tmp_path / "api.db"
    backward_before = torch.autograd.backward
    from torch.optim import optimizer as optim_mod

    hooks_before = len(optim_mod._global_optimizer_post_hooks)
    with memscope.profile(str(db), sample_hz=50) as agent:
        assert torch.autograd.backward is not backward_before  # the step detector is in place
        train(7)
        assert agent.current_step == 7
    assert torch.autograd.backward is backward_before
    assert len(optim_mod._global_optimizer_post_hooks) == hooks_before
    with RunReader(db) as reader:
        summary = summarize(reader)
    assert summary.steps == 7 and summary.status == "finished"
    assert summary.processes[0]["status"] == "stopped"
    # every sample the agent took reached the file (a boundary's sample is skipped when the
    # sampler thread is taking one at that moment: that one stands for it, so with 1 ms steps
    # there can be fewer samples than steps), and the last one, taken at stop, is there
    assert summary.samples >= 1 and summary.samples == summary.processes[0]["samples"]
    train(2)  # after stop, training is untouched and nothing is recorded
    with RunReader(db) as reader:
        assert summarize(reader).steps == 7


def test_manual_steps_do_not_double_count(tmp_path: Path) -> None:
    with memscope.profile(str(tmp_path / "m.db")):
        train(5, manual=True)
    with RunReader(tmp_path / "m.db") as reader:
        s = summarize(reader)
    assert s.steps == 5 and s.step_mode == "manual"


def test_agent_keeps_no_tensor_alive(tmp_path: Path) -> None:
    refs: list[weakref.ref] = []
    memscope.start(str(tmp_path / "w.db"))
    try:
        train(4, refs)
    finally:
        memscope.stop()
    gc.collect()
    assert refs and all(r() is None for r in refs)


def test_existing_file_is_refused(tmp_path: Path) -> None:
    from memscope.store.schema import RunFileError

    db = tmp_path / "x.db"
    db.write_text("keep me")
    # the API's word for it, not the command line's
    with pytest.raises(RunFileError, match=r"pass force=True to overwrite it") as info:
        memscope.start(str(db))
    assert "--force" not in str(info.value)
    with pytest.raises(RunFileError, match=r"pass force=True to overwrite it"):
        with memscope.profile(str(db)):
            pass
    with pytest.raises(RunFileError, match=r"\(force=True replaces only run files") as info:
        memscope.start(str(db), force=True)
    assert "--force" not in str(info.value)
    assert db.read_text() == "keep me"


REFUSED = """
import sys
import threading
import memscope
import memscope.store.writer as writer
from memscope.store.schema import RunFileError

connect = writer.connect_rw


def refuse(*args, **kwargs):  # the agent's writer thread finds the file unusable
    if threading.current_thread().name.startswith("memscope"):
        raise RunFileError("injected: the run file refuses the writer")
    return connect(*args, **kwargs)


writer.connect_rw = refuse
with memscope.profile(sys.argv[1]):
    for _ in range(3):
        memscope.step()
print("trained")
"""


def test_a_record_lost_by_the_writer_is_said_on_stderr(tmp_path: Path) -> None:
    """attach's supervisor reports an incomplete record; an API run says it itself, once, and
    the script's own output and exit status are untouched."""
    import subprocess
    import sys

    script = tmp_path / "refused.py"
    script.write_text(REFUSED)
    db = tmp_path / "refused.db"
    out = subprocess.run([sys.executable, str(script), str(db)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "trained\n", out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("memscope:")]
    assert len(lines) == 1 and "the record is incomplete: cannot open run file: injected" in lines[0], out.stderr
    assert str(db) in lines[0]

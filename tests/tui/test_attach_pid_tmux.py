"""``memscope attach --pid`` with the dashboard in the foreground, in a real terminal (tmux): the
dashboard says that q detaches, q detaches, and the training goes on to its end."""

from __future__ import annotations

import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from test_attach_tmux import ROOT, Pane, pane  # noqa: F401 (pane: the fixture)

TARGET = ROOT / "tests" / "scripts" / "attach_target.py"


def test_q_in_the_dashboard_detaches_and_the_training_goes_on(pane: Pane, tmp_path: Path) -> None:  # noqa: F811
    from memscope.node import debuggers

    try:
        debuggers.choose("auto")
    except debuggers.InjectError as exc:
        pytest.fail(f"no debugger can inject here: {exc} (make test-deps installs lldb)")
    fast = tmp_path / "fast"
    target = subprocess.Popen([sys.executable, str(TARGET), "--steps", "1200", "--sleep", "0.02",
                               "--fast-file", str(fast)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert target.stdout is not None
        assert target.stdout.readline().strip() == "at step 0"
        db = tmp_path / "pid.db"
        cmd = shlex.join([sys.executable, "-m", "memscope", "attach", "--pid", str(target.pid), "--db", str(db)])
        pane.start(f"cd {shlex.quote(str(ROOT))} && {cmd}; echo MEMSCOPE_EXIT=$?; sleep 600")
        screen = pane.wait_for(lambda s: "1 Overview" in s and "live" in s, timeout=120, what="the live dashboard")
        assert "detaches memscope" in screen or "q/ctrl+c: detach" in screen
        pane.keys("q")
        screen = pane.wait_for(lambda s: "MEMSCOPE_EXIT=" in s, timeout=120, what="memscope to exit")
        assert "MEMSCOPE_EXIT=0" in screen and f"detached from pid {target.pid}" in screen
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT status FROM processes").fetchall() == [("detached",)]
        conn.close()
        assert target.poll() is None  # the training goes on
    finally:
        fast.touch()
        out, _ = target.communicate(timeout=300)
    assert target.returncode == 0 and "STATE " in out

"""``memscope attach`` with the dashboard in the foreground, in a real terminal (tmux).

tmux runs the command in an 80x24 pane; the tests read the screen with capture-pane and type with
send-keys, as a user would. Each test gets its own tmux server (-L), killed at the end.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from memscope.store.reader import RunReader
from tmux_pane import Pane, terminal

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pane() -> Iterator[Pane]:
    with terminal() as p:
        yield p


def attach_command(db: Path, *args: str) -> str:
    """The shell line in the pane: attach, then print its exit status and keep the pane."""
    cmd = shlex.join([sys.executable, "-m", "memscope", "attach", "--db", str(db), *args])
    return f"cd {shlex.quote(str(ROOT))} && OMP_NUM_THREADS=1 {cmd}; echo MEMSCOPE_EXIT=$?; sleep 600"


def run_status(db: Path) -> tuple[str, int]:
    with RunReader(db) as reader:
        run = reader.run()
        assert run is not None
        return run["status"], len([s for s in reader.steps() if s["status"] == "ok"])


def test_dashboard_follows_training_and_stays_until_q(pane: Pane, tmp_path: Path) -> None:
    db = tmp_path / "leaky.db"
    pane.start(attach_command(db, "--inventory-every", "2", "--layers-every", "4",
                              "examples/leaky.py", "--steps", "40"))
    screen = pane.wait_for(lambda s: "1 Overview" in s and "live" in s, what="the live dashboard")
    assert "examples/leaky.py --steps 40" in screen
    pane.keys("2")
    pane.wait_for(lambda s: "Linear" in s and "ReLU" in s, what="layer names in the layers view")
    pane.keys("3")
    screen = pane.wait_for(lambda s: "LEAK" in s and "loss_history" in s, what="the leak verdict")
    pane.keys("1")
    screen = pane.wait_for(lambda s: "finished (exit 0)" in s, what="the end of the training")
    assert "40 steps" in screen and "MEMSCOPE_EXIT" not in screen  # still open: waits for q
    pane.keys("2")  # and still answers keys after the end (no wall-clock wait: a key and its effect)
    pane.wait_for(lambda s: "Linear" in s and "MEMSCOPE_EXIT" not in s, what="the layers view after the end")
    pane.keys("q")
    screen = pane.wait_for(lambda s: "MEMSCOPE_EXIT=" in s, what="memscope to exit")
    assert "MEMSCOPE_EXIT=0" in screen
    assert "40 steps" in screen and "finished" in screen  # the headless summary line
    assert run_status(db) == ("finished", 40)
    log = Path(str(db) + ".log").read_text()
    assert "mean loss" in log  # the training's output went to the log, not over the dashboard


def test_quitting_the_dashboard_leaves_training_running(pane: Pane, tmp_path: Path) -> None:
    db = tmp_path / "loop.db"
    go = tmp_path / "go"  # the training holds before step 60 until the test creates it
    # short steps: the hold keeps it live while the test looks, the 60 after it take no waiting
    pane.start(attach_command(db, "tests/scripts/loop.py", "--steps", "120", "--sleep", "0.005",
                              "--hold-at", "60", "--hold-file", str(go)))
    pane.wait_for(lambda s: "live" in s and " steps" in s, what="the live dashboard")
    pane.keys("q")
    screen = pane.wait_for(lambda s: "training goes on" in s, what="the message after q")
    assert "MEMSCOPE_EXIT" not in screen
    status, steps = run_status(db)
    assert status == "running" and steps <= 60  # held, whatever the machine's speed
    go.touch()
    screen = pane.wait_for(lambda s: "MEMSCOPE_EXIT=" in s, timeout=120, what="training to finish")
    assert "MEMSCOPE_EXIT=0" in screen
    assert run_status(db) == ("finished", 120)


def _steps_shown(screen: str) -> str | None:
    found = re.search(r"(\d+) steps", screen)
    return found.group(1) if found else None


def test_ctrl_c_in_the_dashboard_interrupts_training(pane: Pane, tmp_path: Path) -> None:
    """The training (no optimizer: Python dies of the SIGINT; with torch._dynamo imported it
    would exit 1, memscope or not) ends by the interrupt: memscope exits 130, as a headless
    attach does (tests/tui/test_conventions_tmux.py)."""
    db = tmp_path / "loop.db"
    pane.start(attach_command(db, "tests/scripts/loop.py", "--mode", "backward", "--steps", "2000",
                              "--sleep", "0.05"))
    first = pane.wait_for(lambda s: "live" in s and " steps" in s, what="the live dashboard")
    # a refresh after the first frame: the app's loop is reading keys (under load the first
    # frame can come well before the loop settles)
    pane.wait_for(lambda s: _steps_shown(s) not in (None, _steps_shown(first)), what="a refresh")
    pane.keys("C-c")
    time.sleep(1.0)
    told = pane.screen()  # the notification lasts 5 s: kept, so a failure says which side lost the ^C
    try:
        screen = pane.wait_for(lambda s: "interrupted (" in s, what="the interrupted state")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\none second after ^C the screen was:\n{told}") from None
    assert "MEMSCOPE_EXIT" not in screen  # the dashboard stays
    pane.keys("q")
    screen = pane.wait_for(lambda s: "MEMSCOPE_EXIT=" in s, what="memscope to exit")
    assert "MEMSCOPE_EXIT=130" in screen
    status, steps = run_status(db)
    assert status == "interrupted" and steps < 2000  # ^C: interrupted, not "failed, exit 1"


def test_sigint_to_the_process_group_stops_training_not_the_dashboard(pane: Pane, tmp_path: Path) -> None:
    db = tmp_path / "loop.db"
    pane.start(attach_command(db, "tests/scripts/loop.py", "--steps", "2000", "--sleep", "0.05"))
    pane.wait_for(lambda s: "live" in s and " steps" in s, what="the live dashboard")
    os.killpg(pane.foreground_pgid(), signal.SIGINT)  # what ^C does in a terminal in cooked mode
    screen = pane.wait_for(lambda s: "interrupted (" in s, what="the training to stop")
    time.sleep(1.0)
    screen = pane.screen()
    assert "1 Overview" in screen and "MEMSCOPE_EXIT" not in screen  # the dashboard survived
    pane.keys("q")
    screen = pane.wait_for(lambda s: "MEMSCOPE_EXIT=" in s, what="memscope to exit")
    assert "MEMSCOPE_EXIT=0" not in screen
    assert run_status(db)[0] == "interrupted"

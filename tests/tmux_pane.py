"""A real terminal for the tests: tmux runs a command in an 80x24 pane; a test reads the screen
with capture-pane and types with send-keys, as a user would. Each test gets its own tmux server
(-L), killed at the end (tests/tui/test_attach_tmux.py, tests/test_packaging.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from typing import Callable, Iterator

import pytest

TMUX = shutil.which("tmux")


class Pane:
    def __init__(self, socket: str) -> None:
        self.socket = socket

    def tmux(self, *args: str) -> str:
        assert TMUX is not None
        return subprocess.run([TMUX, "-L", self.socket, *args], check=True, capture_output=True,
                              text=True, timeout=30).stdout

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-s", "t", "-x", "80", "-y", "24", command)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def wait_for(self, check: Callable[[str], bool], timeout: float = 60.0, what: str = "") -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if check(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the screen:\n{screen}")
            time.sleep(0.2)

    def foreground_pgid(self) -> int:
        pane_pid = int(self.tmux("display", "-p", "-t", "t", "#{pane_pid}").strip())
        out = subprocess.run(["ps", "-o", "tpgid=", "-p", str(pane_pid)], capture_output=True,
                             text=True, check=True)
        return int(out.stdout.strip())


@contextlib.contextmanager
def terminal() -> Iterator[Pane]:
    """A pane on a tmux server of its own, killed at the end; fails (never skips) without tmux:
    a real terminal is what the tests that use it claim."""
    if TMUX is None:
        pytest.fail("tmux is not installed (apt-get install tmux; make test-deps installs it)")
    p = Pane(f"memscope-test-{os.getpid()}-{time.monotonic_ns()}")
    try:
        yield p
    finally:
        subprocess.run([TMUX or "tmux", "-L", p.socket, "kill-server"], capture_output=True)

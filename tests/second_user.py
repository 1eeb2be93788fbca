"""A real second user on this machine: uid ``nobody`` through ``setpriv`` (the suite runs as root
here). A test that needs one skips, saying why, where the suite is not root; a missing setpriv
fails it (a tool the test needs)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

NOBODY = 65534
# Python for the second user: the venv's interpreter lives under root's home, which nobody
# cannot enter; the system's runs memscope's reading side (standard library only) as well
SYSTEM_PYTHON = "/usr/bin/python3"
ROOT = Path(__file__).resolve().parent.parent


def need_second_user() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second user (setpriv to uid nobody); the suite is not root")
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is missing: the second-user tests need it")


def as_nobody(*command: str, groups: bool = False, timeout: float = 60,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``command`` run as uid/gid nobody (with its supplementary groups when ``groups``)."""
    need_second_user()
    who = ["--init-groups"] if groups else ["--clear-groups"]
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", *who, *command],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd="/")


def nobody_writes(path: Path | str, text: str) -> None:
    """The second user creates ``path`` with ``text`` (a file of theirs, 0644)."""
    res = as_nobody("sh", "-c", 'umask 022; printf "%s" "$1" > "$2"', "sh", text, str(path))
    assert res.returncode == 0, res.stderr


def nobody_memscope(*args: str) -> subprocess.CompletedProcess[str]:
    """``memscope ARGS`` run by the second user (the reading side, with the system's Python)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.fail(f"{SYSTEM_PYTHON} is missing: the second user needs a Python it may run")
    return as_nobody("env", f"PYTHONPATH={ROOT}", "PYTHONDONTWRITEBYTECODE=1", SYSTEM_PYTHON, "-m", "memscope",
                     *args)


@contextlib.contextmanager
def shared_dir(mode: int = 0o1777) -> Iterator[Path]:
    """A directory under /tmp both users may write (pytest's tmp_path is 0700: nobody cannot
    enter it); 0o1777 like /tmp itself, or 0o777 where the second user may also remove and
    rename the first user's files."""
    where = Path(tempfile.mkdtemp(prefix="memscope-shared-", dir="/tmp"))
    os.chmod(where, mode)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)

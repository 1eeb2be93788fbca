"""``memscope daemon --auto-attach``: the deep agent on a leak suspect, for a bounded time.

The daemon runs ``memscope attach --pid PID --headless --max-steps N --duration S`` (the same
command a user runs) on a suspect it may touch: its own user's process, or any as root; never
another user's otherwise (it says so in the node file and on stderr). One attach at a time, once
per process. When the command ends, the run file it left says the verdict, the holder and the
storing line (:func:`memscope.node.recorded.read_recorded`), and the node file records them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from memscope.node.recorded import read_recorded
from memscope.node.target import user_name

MAX_S = 600.0  # an attach records this long at most (--duration), however few steps came


@dataclass
class Attach:
    pid: int
    started: float
    proc_id: int | None
    run_file: str
    popen: subprocess.Popen[str]
    at: float = field(default_factory=time.time)
    stderr: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._drain, daemon=True, name="memscope-attach-output")
        self._reader.start()

    def _drain(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.stderr.append(line.rstrip("\n"))

    def result(self) -> dict[str, Any]:
        self._reader.join(timeout=5)
        rc = self.popen.returncode
        data: dict[str, Any] = {"pid": self.pid, "run_file": self.run_file, "exit_code": rc,
                                "seconds": round(time.time() - self.at, 1)}
        errors = [ln for ln in self.stderr if ln.startswith("memscope: error:")]
        if errors:
            data["error"] = errors[-1][len("memscope: error: "):]
        if os.path.exists(self.run_file):
            rec = read_recorded(self.run_file, self.pid)
            if rec is not None:
                data.update(rec.as_json())
                data["words"] = rec.words
        return data


def may_touch(uid: int) -> str | None:
    """Why the daemon must not attach to a process of ``uid`` (None: it may)."""
    me = os.geteuid()
    if me == 0 or uid == me:
        return None
    return (f"it belongs to user {user_name(uid)} and memscope runs as {user_name(me)}: not touched "
            "(run the daemon as root to attach to every user's processes)")


def run_file_name(directory: str, pid: int) -> str:
    """``DIR/memscope-attach-<pid>-<YYYYmmdd-HHMMSS>.db``, a free name (attach creates it exclusively)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_file = os.path.join(directory, f"memscope-attach-{pid}-{stamp}.db")
    n = 1
    while os.path.lexists(run_file):
        n += 1
        run_file = os.path.join(directory, f"memscope-attach-{pid}-{stamp}-{n}.db")
    return run_file


def start(pid: int, started: float, proc_id: int | None, directory: str, steps: int) -> Attach:
    run_file = run_file_name(directory, pid)
    command = [sys.executable, "-m", "memscope", "attach", "--pid", str(pid), "--headless", "--db", run_file,
               "--max-steps", str(steps), "--duration", f"{MAX_S:g}"]
    popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    return Attach(pid, started, proc_id, run_file, popen)


def stop(attach: Attach, wait_s: float = 90.0) -> None:
    """The daemon is stopping: ask the attach command to detach (its ^C), wait for it."""
    if attach.popen.poll() is not None:
        return
    try:
        attach.popen.send_signal(2)  # SIGINT: the attach command detaches cleanly
        attach.popen.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        attach.popen.kill()
        attach.popen.wait()
    except OSError:
        pass

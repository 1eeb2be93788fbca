"""A process memscope does not record that trains says so in the run file, once.

Children are not recorded by default: DataLoader workers are many and train nothing. One that
trains (its optimizer steps) must not leave the run with no word of it: at its first optimizer
step it writes an ``agent_missing`` event (the report's ``recording`` lines), unless it started
recording itself (``memscope.start()`` in the child joins the run file). Watched in a process
multiprocessing started (memscope/agent/runtime/autostart.py) and in a child made by ``os.fork``
(the agent's at-fork hook)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from memscope.agent.runtime.config import ENV_DB, ENV_PATH

FRESH_WAIT_S = 5.0  # the child's step waits this long at most, once, for the event to be written
_WRITE = ("import json, sys\nfrom memscope.store.runs import add_event\n"
          "add_event(sys.argv[1], 'agent_missing', sys.argv[2], json.loads(sys.argv[3]))")


def watch_unrecorded_training(db: str, how: str, forked: bool = False) -> None:
    """``how``: what made this process (words after its pid in the event). ``forked``: a child
    of ``os.fork``, whose parent's threads may have held SQLite's own locks at the fork (its
    memory allocator's mutex: a connection made here would wait on it for ever); the event is
    written by a fresh process then."""
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except Exception:  # noqa: BLE001 - an old torch (or none yet): nothing to watch with
        return
    said: list[bool] = []

    def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
        # left installed (removing a hook while torch iterates over them breaks the step);
        # it does nothing after the first call, or once the process records itself
        if said:
            return
        said.append(True)
        try:
            from memscope.agent.runtime.api import current
            from memscope.store.runs import add_event

            if current() is not None:  # memscope.start() in the child: it is recorded
                return
            message = (f"recording incomplete: pid {os.getpid()}, {how}, trains (its optimizer stepped) "
                       "but is not recorded: call memscope.start() at the top of the code it runs (it "
                       "joins this run file)")
            data = {"pid": os.getpid(), "parent": os.getppid()}
            if forked:
                _add_event_fresh(db, message, data)
            else:
                add_event(db, "agent_missing", message, data)
        except Exception:  # noqa: BLE001 - a note, never a failure of the user's step
            return

    register_optimizer_step_post_hook(stepped)


def _add_event_fresh(db: str, message: str, data: dict[str, Any]) -> None:
    """The event written by a new interpreter (exec'd: none of this process's locks), where
    memscope is importable; nothing of it in the training's output."""
    env = {k: v for k, v in os.environ.items() if k != ENV_DB}  # not an instrumented process
    where = os.environ.get(ENV_PATH) or os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    env["PYTHONPATH"] = where + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        child = subprocess.Popen([sys.executable, "-c", _WRITE, db, message, json.dumps(data)], env=env,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        child.wait(FRESH_WAIT_S)
    except (OSError, subprocess.SubprocessError):
        return

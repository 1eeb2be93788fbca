"""The Python API behind ``memscope.start/stop/step/profile``: one agent per process."""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from memscope.agent.runtime.config import ENV_DB, AgentOptions
from memscope.agent.runtime.agent import Agent
from memscope.store.runs import new_run

_agent: Agent | None = None
_lock = threading.Lock()


def current() -> Agent | None:
    return _agent if _agent is not None and _agent.running else None


def start(db: str | None = None, force: bool = False, group_readable: bool = False,
          **options: Any) -> Agent:
    """Record this process into the run file ``db`` (default: ``memscope-<script>-<time>.db``
    here, another unpredictable name when that one is taken). ``force`` replaces an existing
    run file; ``group_readable`` makes the file 0640 (default 0600)."""
    if db is None and os.environ.get(ENV_DB) and current() is None:
        # under memscope attach (a process the bootstrap did not arm: a spawned child that
        # trains): join attach's run file as one more process
        return start_from_env(**options)
    global _agent
    with _lock:
        if _agent is not None and _agent.running:
            return _agent
        opts = AgentOptions.from_mapping(options)
        path, _ = new_run(db, sys.argv, [sys.executable, *sys.argv], force, force_word="force=True",
                          group_readable=group_readable)
        _agent = Agent(path, opts, owns_run=True)
        _agent.start()
        atexit.register(stop)
        return _agent


def start_from_env(**options: Any) -> Agent:
    """Start the agent ``memscope attach`` asked for: the supervisor made the run file."""
    global _agent
    with _lock:
        if _agent is not None and _agent.running:
            return _agent
        opts = AgentOptions.from_env()
        if options:
            opts = AgentOptions.from_mapping({**json.loads(opts.to_json()), **options})
        _agent = Agent(os.environ[ENV_DB], opts, owns_run=False)
        _agent.start()
        atexit.register(stop)
        return _agent


def stop() -> None:
    with _lock:
        if _agent is not None and _agent.running:
            _agent.stop()
            problem = _agent.recording_problem() if _agent.owns_run else None
            if problem:  # attach's supervisor says this itself; an API run has no one else to
                print(f"memscope: warning: {_agent.db}: the record is incomplete: {problem}",
                      file=sys.stderr)


def step() -> None:
    agent = _agent
    if agent is not None:
        agent.step()


@contextmanager
def profile(db: str | None = None, **options: Any) -> Iterator[Agent]:
    agent = start(db, **options)  # force, group_readable among them
    try:
        yield agent
    finally:
        if agent.owns_run:
            stop()


def _after_fork_in_child() -> None:
    if _agent is not None:
        _agent.disable_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)

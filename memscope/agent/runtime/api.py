"""The Python API behind ``memscope.start/stop/step/profile``: one agent per process.

In scripts and notebooks alike: ``name=`` names the run (a ``run_name`` event, as the framework
callbacks record it); a path this process already recorded into is not an error (a notebook cell
run again) but the next numbered file, said in one line; ``start()`` while recording says which
file records. Inside a Jupyter kernel the run is named after the notebook (or "notebook"), not
after ``ipykernel_launcher.py -f /tmp/kernel-....json``. An error is one line in a notebook
(:class:`ApiError`: IPython shows ``_render_traceback_`` instead of a traceback).
"""

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
from memscope.redact import Redaction
from memscope.store.runs import default_db_path, new_run
from memscope.store.schema import RunFileError

_agent: Agent | None = None
_lock = threading.Lock()
_recorded: list[str] = []  # run files this process created, in order (memscope.load() reads the last)


class ApiError(RunFileError):
    """A run file the API cannot record into: one line in IPython (no traceback), a
    RunFileError everywhere else."""

    def _render_traceback_(self) -> list[str]:
        return [f"memscope: error: {self}"]


def current() -> Agent | None:
    return _agent if _agent is not None and _agent.running else None


def last_recorded() -> str | None:
    """The run file this process recorded into last (None: none yet)."""
    return _recorded[-1] if _recorded else None


def start(db: str | None = None, force: bool = False, name: str | None = None, group_readable: bool = False,
          **options: Any) -> Agent:
    """Record this process into the run file ``db`` (default: ``memscope-<script>-<time>.db``
    here, another unpredictable name when that one is taken; in a notebook, the notebook's
    name, numbered on). ``force`` replaces an existing run file; ``group_readable`` makes the
    file 0640 (default 0600)."""
    if db is None and os.environ.get(ENV_DB) and current() is None:
        # under memscope attach (a process the bootstrap did not arm: a spawned child that
        # trains): join attach's run file as one more process
        return start_from_env(**options)
    if name is not None and not isinstance(name, str):
        raise ValueError(f"name must be a string, not {name!r}")
    global _agent
    with _lock:
        if _agent is not None and _agent.running:
            if db is not None and os.path.abspath(db) != os.path.abspath(_agent.db):
                print(f"memscope: warning: already recording into {_agent.db}; {db} was not started "
                      "(memscope.stop() first to record into another file)", file=sys.stderr)
            return _agent
        opts = AgentOptions.from_mapping(options)
        kernel = in_kernel()
        shown = [sys.executable, "-m", "ipykernel_launcher"] if kernel else [sys.executable, *sys.argv]
        path: str | None = db or (default_db_path([kernel]) if kernel else None)
        if path is not None and not force:
            path = _next_free(path)  # a cell run again: the next number
        try:
            path, _ = new_run(path, [kernel] if kernel else sys.argv, shown, force, force_word="force=True",
                              group_readable=group_readable, redaction=Redaction.from_options(opts))
        except RunFileError as exc:
            raise ApiError(str(exc)) from None
        _recorded.append(os.path.abspath(path))
        _agent = Agent(path, opts, owns_run=True)
        _agent.start()
        run_name = name if name is not None else kernel
        if run_name:
            _agent.event("run_name", run_name, {"name": run_name, "source": "api" if name is not None else "kernel"})
        atexit.register(stop)
        return _agent


def _next_free(path: str) -> str:
    """``path``, or when this process recorded into it already (a notebook cell run again), the
    next numbered name (``nb.db`` -> ``nb-2.db``), said in one line. A file this process did not
    make is left to prepare_path (refused without force=True)."""
    if os.path.abspath(path) not in _recorded or not os.path.lexists(path):
        return path
    stem, ext = os.path.splitext(path)
    n = 2
    while os.path.lexists(f"{stem}-{n}{ext}"):
        n += 1
    new = f"{stem}-{n}{ext}"
    print(f"memscope: {path} holds this session's earlier run: recording into {new}", file=sys.stderr)
    return new


def in_kernel() -> str | None:
    """Inside a Jupyter (IPython) kernel: the notebook's name when the front end says it
    (Jupyter Server's JPY_SESSION_NAME, VS Code's __vsc_ipynb_file__), else "notebook"; None
    outside a kernel."""
    if "ipykernel" not in sys.modules or not os.path.basename(sys.argv[0] if sys.argv else "").startswith(
            ("ipykernel", "ipykernel_launcher")):
        return None
    where = os.environ.get("JPY_SESSION_NAME") or ""
    if not where:
        try:
            shell = sys.modules["IPython"].get_ipython()
            where = str(shell.user_ns.get("__vsc_ipynb_file__") or "")
        except Exception:
            where = ""
    stem = os.path.splitext(os.path.basename(where))[0]
    return stem or "notebook"


def start_from_env(at_torch_import: bool = False, **options: Any) -> Agent:
    """Start the agent ``memscope attach`` asked for: the supervisor made the run file.
    ``at_torch_import``: the bootstrap starts it as torch's import ends (no module built yet)."""
    global _agent
    with _lock:
        if _agent is not None and _agent.running:
            return _agent
        opts = AgentOptions.from_env()
        if options:
            opts = AgentOptions.from_mapping({**json.loads(opts.to_json()), **options})
        _agent = Agent(os.environ[ENV_DB], opts, owns_run=False, at_torch_import=at_torch_import)
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
def profile(db: str | None = None, name: str | None = None, **options: Any) -> Iterator[Agent]:
    agent = start(db, name=name, **options)  # force, group_readable among them
    try:
        yield agent
    finally:
        if agent.owns_run:
            stop()


def _after_fork_in_child() -> None:
    if _agent is not None and _agent.running:
        _agent.disable_after_fork()
        # not recorded (a DataLoader worker trains nothing); one that trains says so
        try:
            from memscope.agent.runtime.unrecorded import watch_unrecorded_training

            watch_unrecorded_training(_agent.db, f"forked from pid {os.getppid()} (os.fork)", forked=True)
        except Exception:  # noqa: BLE001 - never a failure of the user's fork
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)

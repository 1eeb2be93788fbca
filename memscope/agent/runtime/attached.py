"""The agent in a process memscope was injected into (``memscope attach --pid``): start, detach.

Started on the bootstrap's thread, not the training's, while the training runs. What changes
against a launched run:

* Steps count from the attach: the first step boundary after it only marks where step 0
  begins (the step in progress started before memscope was there). The training's own step
  number before the attach is unknown, and the run says so rather than guess.
* Hooks that torch iterates lazily (the global optimizer step hooks: ``chain(dict.values())``)
  must not change while the training thread is inside such an iteration ("OrderedDict mutated
  during iteration" in the user's step). They are installed from here only while those dicts are
  empty (nothing iterates an empty dict long enough to see a change); else, and for their
  removal at detach, at the training thread's next ``backward`` (memscope's wrapper of
  ``torch.autograd.backward`` runs the job on entry; no optimizer step iterates its hooks then).
  Not a global module hook: with a ``torch.compile(module)`` alive, one makes torch warn into
  the training's output.
* Detach (``memscope detach``, the attach command's ^C / q / --duration / --max-steps, or the
  command gone): at the next step boundary, on the training thread (the collectors that hold
  thread-local state for a step, the layer profiler's saved-tensor hooks and the one-step peak's
  dispatch mode, end there cleanly); if no boundary comes within DETACH_WAIT_S, from memscope's
  own thread. The run file closes with a ``detached`` event; every hook, patch and thread goes.
  The optimizer hooks and the ``backward`` wrapper go at the next ``backward`` (inert until then).
  What stays: memscope's modules, imported (inert; a later attach reuses them), and this module's
  fork handler (Python cannot unregister one; it does nothing unless an agent records).
"""

from __future__ import annotations

import atexit
import os
import sqlite3
import sys
import threading
import time
from typing import Any

from memscope.agent.runtime.watchdog import SupervisorWatch

DETACH_POLL_S = 0.5  # how often the run file is asked whether a detach was requested
DETACH_WAIT_S = 5.0  # for a step boundary (the training thread) before detaching from memscope's thread
DETACH_HARD_S = 60.0  # longer while a measured step holds thread-local state (rare)
EVENT_DETACH_REQUEST = "detach_requested"

_current: "Attachment | None" = None
_start_lock = threading.Lock()


class AttachFailed(RuntimeError):
    """Why the agent does not start in this process (the command prints it)."""


class Attachment:
    """One attach of the agent to this process, from start to detach."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.db: str = args["db"]
        self.db_id = (int(args["db_id"][0]), int(args["db_id"][1]))
        self.supervisor = int(args["supervisor"])
        self.process_started = args.get("process_started")
        self.detach_after = int(args.get("max_steps") or 0)
        self.attached_at = time.time()
        self.agent: Any = None
        self.reason: str | None = None  # why the agent detaches, once asked
        self._asked_at = 0.0
        self._lock = threading.Lock()
        self.detached = threading.Event()
        self._watch: SupervisorWatch | None = None
        self._conn: sqlite3.Connection | None = None
        self._conn_lock = threading.Lock()  # memscope's thread reads through it; a detach closes it
        self._unmapped = False  # the debugger's page, given back once the command said where it is

    # -- start ---------------------------------------------------------------------------------

    def process_fields(self) -> dict[str, Any]:
        return {"attached": self.attached_at, "process_started": self.process_started}

    def install_tracker(self, tracker: Any) -> None:
        """The step tracker, from memscope's bootstrap thread (the first thing the agent does
        once its process row exists: the ``attached`` event comes first)."""
        self.agent.event("attached", f"memscope attached to pid {os.getpid()}, running since "
                                f"{_clock(self.process_started)} ({_ago(self.process_started, self.attached_at)}); "
                                "steps count from the first step boundary after the attach",
                    {"pid": os.getpid(), "process_started": self.process_started,
                     "attached": self.attached_at, "supervisor": self.supervisor})
        tracker.anchor_pending = True
        tracker.on_anchor = self._anchored
        from torch.optim import optimizer as optim_module

        # the program's own global optimizer hooks: torch may be iterating them right now
        busy = bool(optim_module._global_optimizer_pre_hooks or optim_module._global_optimizer_post_hooks)
        tracker.install(optimizer_hooks_now=not busy)

    def started(self, turns: Any) -> None:
        """The agent runs: watch the command, and the run file for a detach request."""
        self._watch = SupervisorWatch(self.supervisor, self._supervisor_gone)
        self._watch.start()
        turns.every(DETACH_POLL_S, self._poll)

    def _anchored(self, t: float) -> None:
        self.agent.event("steps_anchored", "the first step boundary after the attach: step 0 begins here",
                         {"t": t})
        self.agent.steps_anchored()

    # -- detach requests -----------------------------------------------------------------------

    def request(self, reason: str) -> None:
        """Ask for a detach (any thread): it happens at the next step boundary, or after
        DETACH_WAIT_S from memscope's thread (see :meth:`_poll`)."""
        with self._lock:
            if self.reason is None:
                self.reason = reason
                self._asked_at = time.monotonic()

    def _poll(self) -> bool:
        """memscope's thread, every DETACH_POLL_S: a request in the run file, the command gone,
        a requested detach that no step boundary carried out in time. False: stop polling."""
        if self.detached.is_set():
            self._close_conn()
            return False
        if not self._unmapped:
            self._unmapped = _unmap(self._read_page())
        if self._watch is not None and not self._watch.alive():
            self._supervisor_gone(self.supervisor)
        if self.reason is None:
            asked = self._requested()
            if asked:
                self.request(asked)
        if self.reason is not None and time.monotonic() - self._asked_at >= self._wait_s():
            threading.Thread(target=self.detach_now, args=(False,), name="memscope-detach",
                             daemon=True).start()
            return False
        return True

    def _wait_s(self) -> float:
        agent = self.agent
        busy = agent is not None and agent.step_state_held()
        return DETACH_HARD_S if busy else DETACH_WAIT_S

    def _query(self, sql: str, params: tuple[Any, ...]) -> Any:
        with self._conn_lock:
            try:
                if self.detached.is_set():
                    return None  # a detached agent holds nothing of the run file
                if self._conn is None:
                    self._conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=0.2,
                                                 check_same_thread=False)
                return self._conn.execute(sql, params).fetchone()
            except sqlite3.Error:
                return None  # locked for a moment, or gone: the supervisor watch covers the latter
            finally:
                if self.detached.is_set():  # a detach during the query left the close to us
                    self._drop_conn()

    def _requested(self) -> str | None:
        row = self._query("SELECT message FROM events WHERE kind = ? AND t >= ? LIMIT 1",
                          (EVENT_DETACH_REQUEST, self.attached_at - 1))
        return str(row[0] or "memscope detach") if row else None

    def _read_page(self) -> tuple[int, int] | None:
        """Where the debugger's page is (the command writes it after the injection)."""
        row = self._query("SELECT data FROM events WHERE kind = 'attach_injected' LIMIT 1", ())
        if not row or not row[0]:
            return None
        try:
            import json

            data = json.loads(row[0])
            if data.get("pid") != os.getpid():
                return None
            return int(data["page"]), int(data["bytes"])
        except (ValueError, KeyError, TypeError):
            return None

    def _close_conn(self, wait: bool = True) -> None:
        """Close the run file's read connection; ``wait=False`` (the training thread) never
        waits for a query of memscope's thread: that query closes it (:meth:`_query`)."""
        if not self._conn_lock.acquire(blocking=wait):
            return
        try:
            self._drop_conn()
        finally:
            self._conn_lock.release()

    def _drop_conn(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def _supervisor_gone(self, pid: int) -> None:
        self.request(f"the attach command (pid {pid}) is gone")

    # -- detach --------------------------------------------------------------------------------

    def step_closed(self, step: int) -> None:
        """The training thread, at the end of a step boundary."""
        if self.detach_after and step + 1 >= self.detach_after and self.reason is None:
            self.request(f"{self.detach_after} steps recorded (--max-steps)")
        if self.reason is not None:
            self.detach_now(True)

    def detach_now(self, from_training_thread: bool) -> None:
        """Stop the agent and take every hook back (once, whichever thread gets here first)."""
        global _current
        with self._lock:
            if self.detached.is_set():
                return
            self.detached.set()
        # before the process row says detached (agent.stop): the command waits until the file
        # is closed, and would otherwise wait for memscope's thread's next poll
        self._close_conn(wait=False)
        agent = self.agent
        try:
            agent.event("detached", f"memscope detached: {self.reason}; the training goes on",
                        {"reason": self.reason, "steps": agent.current_step,
                         "on_training_thread": from_training_thread})
            agent.stop(detaching=True, on_training_thread=from_training_thread)
        finally:
            if self._watch is not None:
                self._watch.stop()
            try:
                atexit.unregister(_at_exit)
            except Exception:  # noqa: BLE001
                pass
            from memscope.agent.runtime import interrupts

            interrupts.uninstall()
            if _current is self:
                _current = None

def _at_exit() -> None:
    """The process ends while attached: record its end as a launched run's agent would."""
    att = _current
    if att is not None and att.agent is not None and not att.detached.is_set():
        att.detached.set()
        try:
            att.agent.stop()
        except Exception:  # noqa: BLE001
            pass


def _clock(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "an unknown time"


def _ago(t: float | None, now: float) -> str:
    if not t:
        return "its start time unknown"
    s = max(0, int(now - t))
    return f"{s // 3600} h {s % 3600 // 60} min before" if s >= 3600 else f"{s // 60} min {s % 60} s before"


def _after_fork_in_child() -> None:
    att = _current
    if att is not None and att.agent is not None and att.agent.running:
        att.agent.disable_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def start(args: dict[str, Any]) -> None:
    """Start the agent in this process (the bootstrap's thread). Raises AttachFailed."""
    global _current
    from memscope.agent.runtime.config import AgentOptions

    with _start_lock:
        if _current is not None and not _current.detached.is_set():
            raise AttachFailed(f"memscope is already attached here, recording into {_current.db}")
        api = sys.modules.get("memscope.agent.runtime.api")
        running = api.current() if api is not None else None
        if running is not None:
            raise AttachFailed(f"memscope already records this process into {running.db}")
        if "torch" not in sys.modules:
            raise AttachFailed("torch is not imported in this process")
        from memscope.agent.runtime.agent import Agent

        options = AgentOptions.from_mapping(args.get("options") or {})
        att = Attachment(args)
        agent = Agent(att.db, options, owns_run=False, attach=att)
        att.agent = agent
        _current = att
        atexit.register(_at_exit)  # before the agent's first row: an exit from now on is recorded
        try:
            agent.start()
        except BaseException:
            _current = None
            atexit.unregister(_at_exit)
            raise


def _unmap(where: tuple[int, int] | None) -> bool:
    """Give back the pages the debugger mapped for the bootstrap's text (read and compiled long
    before this thread got here); whether that is done (or nothing is left to do)."""
    if where is None:
        return False
    page, size = where
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        libc.munmap(ctypes.c_void_p(page), ctypes.c_size_t(size))
    except Exception:  # noqa: BLE001 - four pages left: nothing to break the training for
        pass
    return True

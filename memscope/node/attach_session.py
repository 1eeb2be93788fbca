"""``memscope attach --pid`` from the command's side: inject, confirm, watch, detach.

1. The target is inspected (:mod:`memscope.node.target`): every refusal is one line.
2. The run file is created (as for a launched run; owned by the target's user when root attaches
   to another user's process, since the agent inside writes it as that user).
3. The bootstrap (:mod:`memscope.node.bootstrap_text`) is queued as a pending call: through
   ``sys.remote_exec`` where both Pythons are 3.14+, else through gdb or lldb
   (:mod:`memscope.node.debuggers`).
4. The command waits for the agent's process row, or its ``attach_failed`` event, until the
   deadline; past it the queued bootstrap is neutralised (a target blocked in a long C call is
   left running, untouched but for that comment) and the run file removed.
5. Recording: until the target ends, --duration elapses, --max-steps steps are recorded (the
   agent counts them), ``memscope detach`` or ^C; a detach is asked through the run file
   (an event the agent polls), and the process row's status says when it is done; the command
   says so once the target has closed the run file too (an attach right after is not refused).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from memscope.node import debuggers
from memscope.node.bootstrap_text import pending_call
from memscope.node.target import Target, inspect, open_run_files, start_time
from memscope.store.runs import add_event, discard_run, finish_run, new_run

EVENT_DETACH_REQUEST = "detach_requested"  # the agent's side: memscope.agent.runtime.attached
GRACE_S = 5.0  # after the deadline: a bootstrap that started just before it still shows up
DETACH_TIMEOUT_S = 75.0  # the agent's longest wait for a step boundary (60 s), and some
RELEASE_TIMEOUT_S = 10.0  # after the row says detached: the agent's last close of the run file


class AttachError(Exception):
    """Why the attach did not happen: one line; the target was left running."""


@dataclass
class Session:
    db: str
    target: Target
    proc: int  # the agent's process row
    method: str
    attached_at: float
    seconds_to_agent: float  # from the injection's start to the agent's first row
    notes: list[str] = field(default_factory=list)


def _reader_conn(db: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)


def _process_row(db: str, pid: int, running: bool = False) -> tuple[int, str] | None:
    """The agent's process row (``running``: only once its ``attached`` event is written too,
    which the agent does when every part of it is in place)."""
    try:
        conn = _reader_conn(db)
        try:
            row = conn.execute("SELECT id, status FROM processes WHERE pid = ? AND attached IS NOT NULL"
                               " ORDER BY id DESC LIMIT 1", (pid,)).fetchone()
            if row and running and not conn.execute("SELECT 1 FROM events WHERE proc = ? AND kind = 'attached'",
                                                    (row[0],)).fetchone():
                return None
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return (int(row[0]), str(row[1])) if row else None


def _failure(db: str) -> str | None:
    try:
        conn = _reader_conn(db)
        try:
            row = conn.execute("SELECT message FROM events WHERE kind = 'attach_failed' LIMIT 1").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return str(row[0]) if row else None


def alive(target: Target) -> bool:
    """Whether the process that was inspected still runs (the pid not reused since)."""
    try:
        return abs(start_time(target.pid) - target.started) < 1.0 and _state(target.pid) != "Z"
    except (OSError, IndexError, ValueError):
        return False


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        text = f.read().decode("ascii", "replace")
    return text[text.rfind(")") + 2:].split()[0]


def _method(target: Target, debugger: str) -> str:
    if target.python >= (3, 14) and hasattr(sys, "remote_exec") and debugger == "auto":
        return "sys.remote_exec"
    try:
        return debuggers.choose(debugger)
    except debuggers.InjectError as exc:
        raise AttachError(str(exc)) from None


def _remote_exec(target: Target, code: bytes) -> tuple[int | None, str]:
    """Python 3.14+: the interpreter runs the file at its next safe point (its own pending
    mechanism). The file is readable by the target's user, and removed once it ran."""
    where = tempfile.mkdtemp(prefix="memscope-attach-")
    os.chmod(where, 0o755)  # the target's user reads it (root attaching to another user)
    path = os.path.join(where, "bootstrap.py")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(code + b"\n")
    try:
        sys.remote_exec(target.pid, path)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - its message is the reason
        raise AttachError(f"sys.remote_exec into pid {target.pid} failed: {exc}") from None
    return None, where


def attach(pid: int, db: str | None, options: dict[str, Any], *, max_steps: int = 0, debugger: str = "auto",
           timeout: float = 15.0, force: bool = False, group_readable: bool = False,
           shown: Callable[[Target], list[str]] | None = None,
           say: Callable[[str], None] | None = None) -> Session:
    """Start the agent in ``pid``, recording into a new run file: ``db``, or with None a default
    name after the target's script (:func:`memscope.store.runs.new_run`: made exclusively, 0600).
    Raises TargetError / AttachError / RunFileError (one line each); on failure the run file is
    removed and the target left running."""
    from memscope.agent.runtime.config import AgentOptions  # options only: no torch
    from memscope.redact import Redaction

    target = inspect(pid)
    method = _method(target, debugger)
    command = shown(target) if shown is not None else target.argv
    redaction = Redaction.from_options(AgentOptions.from_mapping(options))
    db, created = new_run(db, target.argv, command, force, group_readable=group_readable, redaction=redaction)
    try:
        if target.uid != os.geteuid():
            os.chown(db, target.uid, -1)  # the agent inside writes it as the target's user
        return _inject(target, db, created, options, max_steps, method, timeout, say)
    except BaseException:
        discard_run(db, created)  # only the file this call made
        raise


def _inject(target: Target, db: str, created: tuple[int, int] | None, options: dict[str, Any],
            max_steps: int, method: str, timeout: float, say: Callable[[str], None] | None) -> Session:
    began = time.time()
    args = {"db": os.path.abspath(db), "db_id": list(created or (0, 0)), "supervisor": os.getpid(),
            "process_started": target.started, "max_steps": max_steps, "options": options,
            # past this the bootstrap starts nothing (after the debugger's own bound: its run counts)
            "deadline": began + debuggers.RUN_BOUND_S + timeout}
    code = pending_call(args)
    if say is not None:
        say(f"memscope: attaching to pid {target.pid} ({target.command[:80]}) with {method}")
    page: int | None = None
    leftover = None
    if method == "sys.remote_exec":
        page, leftover = _remote_exec(target, code)
    else:
        try:
            page = debuggers.inject(target.pid, code, method).page
        except debuggers.InjectError as exc:
            raise AttachError(str(exc)) from None
    try:
        row = _wait_for_agent(target, db, time.time() + timeout)
        if row is None and page is not None:
            debuggers.neutralize(target.pid, page)
        if row is None:
            row = _wait_for_agent(target, db, time.time() + GRACE_S)
        if row is None:
            if not alive(target):
                raise AttachError(f"pid {target.pid} ended before memscope's agent started in it")
            raise AttachError(
                f"pid {target.pid} did not reach a point where Python runs within {timeout:.0f} s (its main "
                "thread is blocked in a long C call, or waits on a lock); memscope left it running and "
                "cancelled its bootstrap (--attach-timeout to wait longer)")
    finally:
        if leftover is not None:
            import shutil

            shutil.rmtree(leftover, ignore_errors=True)
    proc, _status = row
    if page is not None:  # the agent gives the debugger's pages back once it reads where they are
        add_event(db, "attach_injected", f"bootstrap injected through {method}",
                  {"pid": target.pid, "page": page, "bytes": debuggers.PAGE, "method": method}, proc=proc)
    return Session(db=db, target=target, proc=proc, method=method, attached_at=time.time(),
                   seconds_to_agent=time.time() - began)


def _wait_for_agent(target: Target, db: str, until: float) -> tuple[int, str] | None:
    while True:
        row = _process_row(db, target.pid, running=True)
        if row is not None:
            return row
        failed = _failure(db)
        if failed is not None:
            raise AttachError(f"memscope's agent did not start in pid {target.pid}: {failed}")
        if not alive(target):
            raise AttachError(f"pid {target.pid} ended before memscope's agent started in it")
        if time.time() >= until:
            return None
        time.sleep(0.05)


def request_detach(db: str, why: str) -> bool:
    """Ask the agent recording into ``db`` to detach (it polls the run file)."""
    return add_event(db, EVENT_DETACH_REQUEST, why, {"by": os.getpid()})


def status(db: str, pid: int) -> str | None:
    row = _process_row(db, pid)
    return row[1] if row is not None else None


def watch(session: Session, duration: float | None, interrupted: Callable[[], int],
          on_poll: Callable[[], bool] | None = None) -> str:
    """Wait while the agent records: returns how it ended: ``detached`` (asked, or --max-steps),
    ``exited`` (the target ended), ``lost`` (no detach within DETACH_TIMEOUT_S of asking).
    ``interrupted()`` counts the user's ^C so far; ``on_poll()`` True asks for a detach too (the
    dashboard closed)."""
    asked_at: float | None = None
    started = time.monotonic()
    while True:
        state = status(session.db, session.target.pid)
        if state == "detached":
            released(session.target.pid, session.db)
            return "detached"
        if state in ("stopped", "lost") or not alive(session.target):
            return "exited"
        why = None
        if duration is not None and time.monotonic() - started >= duration:
            why = f"--duration {duration:g} s elapsed"
        elif interrupted():
            why = "^C in memscope attach"
        elif on_poll is not None and on_poll():
            why = "the dashboard was closed"
        if why is not None and asked_at is None:
            request_detach(session.db, why)
            asked_at = time.monotonic()
        if asked_at is not None and (time.monotonic() - asked_at > DETACH_TIMEOUT_S or interrupted() > 1):
            return "lost"
        time.sleep(0.1)


def finish(session: Session, outcome: str) -> None:
    """The run's end in its file (the agent wrote its process row's)."""
    if outcome == "exited" and status(session.db, session.target.pid) == "running":
        add_event(session.db, "process_ended", f"pid {session.target.pid} ended while memscope was "
                  "attached, without its exit handlers running (killed, or os._exit); its exit status "
                  "is not known to memscope", {"pid": session.target.pid}, proc=session.proc)
    elif outcome == "exited":
        add_event(session.db, "process_ended", f"pid {session.target.pid} ended while memscope was "
                  "attached (its exit status is not known to memscope: it did not start it)",
                  {"pid": session.target.pid}, proc=session.proc)
    elif outcome == "lost":
        add_event(session.db, "warning", f"the agent in pid {session.target.pid} did not detach within "
                  f"{DETACH_TIMEOUT_S:.0f} s of being asked; it detaches by itself once this command "
                  "is gone", {"pid": session.target.pid}, proc=session.proc)
    finish_run(session.db, exit_code=None, signal=None, status="finished")


def detach_pid(pid: int, timeout: float = DETACH_TIMEOUT_S) -> str:
    """``memscope detach PID``: ask the agent in ``pid`` to detach and wait until it has;
    returns its run file. Raises AttachError (one line)."""
    if not os.path.isdir(f"/proc/{pid}"):
        raise AttachError(f"no such process: {pid}")
    files = open_run_files(pid)
    if not files:
        if not os.access(f"/proc/{pid}/fd", os.R_OK):
            raise AttachError(f"pid {pid}: cannot see its open files (another user's process: run as root)")
        raise AttachError(f"pid {pid} is not recorded by memscope")
    db = files[0]
    if status(db, pid) is None:
        raise AttachError(f"pid {pid} was started by memscope attach, not attached by pid: stop its "
                          f"`memscope attach` (^C) to end its run ({db})")
    if not request_detach(db, f"memscope detach (pid {os.getpid()})"):
        raise AttachError(f"cannot write the detach request into {db}")
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        state = status(db, pid)
        if state != "running":
            released(pid, db)
            return db
        time.sleep(0.1)
    raise AttachError(f"pid {pid} did not detach within {timeout:.0f} s (no step boundary, and memscope's "
                      "own thread could not run?)")


def released(pid: int, db: str, timeout: float = RELEASE_TIMEOUT_S) -> bool:
    """Wait until ``pid`` no longer holds ``db`` open: a detach is done when the target keeps
    nothing of memscope's, so that an attach right after it is not refused as already recorded
    (the agent closes its reads of the file before its row says detached; this makes sure).
    False if it still did after ``timeout`` (that attach would be refused)."""
    try:
        mine = os.stat(db)
    except OSError:
        return True

    def same(path: str) -> bool:
        try:
            return os.path.samestat(os.stat(path), mine)
        except OSError:
            return False

    until = time.monotonic() + timeout
    while True:
        if not any(same(path) for path in open_run_files(pid)):  # none, too, once pid is gone
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(0.05)


def interrupt_counter() -> Callable[[], int]:
    """Count SIGINTs (^C) instead of dying on the first: the first asks for a detach."""
    count = [0]

    def handler(signum: int, frame: Any) -> None:
        count[0] += 1
        if count[0] == 1:
            print("memscope: detaching (^C again to stop waiting for it)", file=sys.stderr)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return lambda: count[0]

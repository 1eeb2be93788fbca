"""The ``attach`` supervisor: start the command with the agent bootstrapped, wait, record.

The child is the user's command, unchanged: same interpreter, argv, working directory and
``__main__``; memscope reaches it only through the environment (a ``sitecustomize`` first on
``PYTHONPATH`` plus ``MEMSCOPE_*`` variables).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import memscope
from memscope.agent.config import ENV_DB, ENV_OPTIONS, ENV_PATH, ENV_SKIP_CHILD_OF
from memscope.runners.workers import WorkerSampler

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(memscope.__file__)), "agent", "bootstrap")
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_SI_KERNEL = 0x80  # si_code of a signal the kernel sent (a terminal's ^C goes to the whole group)
_LAUNCHERS = {"torchrun", "torch.distributed.run", "torch.distributed.launch"}


class LaunchError(Exception):
    """The command could not be started (one line for the user)."""


@dataclass
class ChildExit:
    exit_code: int | None  # None when killed by a signal
    signal: int | None
    ended: float

    @property
    def status(self) -> int:
        """What memscope exits with: the child's code, or 128 + N for signal N."""
        return 128 + self.signal if self.signal is not None else (self.exit_code or 0)


def is_launcher(command: Sequence[str]) -> bool:
    """torchrun and friends: their workers are recorded, not the launcher itself."""
    if not command:
        return False
    if os.path.basename(command[0]) in _LAUNCHERS:
        return True
    return "-m" in command[:-1] and command[command.index("-m") + 1] in _LAUNCHERS


def child_environment(db: str, options_json: str, command: Sequence[str]) -> dict[str, str]:
    env = dict(os.environ)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = BOOTSTRAP_DIR + (os.pathsep + existing if existing else "")
    env[ENV_DB] = os.path.abspath(db)
    env[ENV_OPTIONS] = options_json
    env[ENV_PATH] = os.path.dirname(os.path.dirname(os.path.abspath(memscope.__file__)))
    env["MEMSCOPE_PYTHON"] = "%d.%d" % sys.version_info[:2]
    if is_launcher(command):
        env[ENV_SKIP_CHILD_OF] = str(os.getpid())
    else:
        env.pop(ENV_SKIP_CHILD_OF, None)
    return env


def resolve(command: Sequence[str]) -> list[str]:
    """Check the program exists before creating anything; raise LaunchError if not."""
    if not command:
        raise LaunchError("no command given")
    program = command[0]
    if os.sep in program:
        if not os.path.exists(program):
            raise LaunchError(f"no such program: {program}")
        if not os.access(program, os.X_OK):
            raise LaunchError(f"not executable: {program}")
    elif shutil.which(program) is None:
        raise LaunchError(f"command not found: {program}")
    return list(command)


def run_child(command: Sequence[str], env: dict[str, str]) -> ChildExit:
    # DataLoader workers' memory, sampled from outside while we wait (memscope.runners.workers)
    sampler = WorkerSampler(env[ENV_DB]) if env.get(ENV_DB) else None
    tick: Callable[[int], None] = sampler.tick if sampler is not None else _no_tick
    try:
        if hasattr(signal, "sigtimedwait") and hasattr(os, "posix_spawnp"):
            return _run_linux(command, env, tick)
        return _run_portable(command, env, tick)
    finally:
        if sampler is not None:
            sampler.close()


def _no_tick(pid: int) -> None:
    pass


def _run_linux(command: Sequence[str], env: dict[str, str], tick: Callable[[int], None]) -> ChildExit:
    """Block the signals we care about and collect them with sigtimedwait: we learn who sent
    each one, so a ^C the terminal already delivered to the child is not delivered twice."""
    watched = set(_FORWARDED) | {signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        try:
            # The child gets our original mask, and inherits dispositions untouched.
            pid = os.posix_spawnp(command[0], list(command), env, setsigmask=old_mask)
        except OSError as exc:
            raise LaunchError(f"cannot start {command[0]}: {exc.strerror}") from None
        while True:
            info = signal.sigtimedwait(watched, 0.5)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            tick(pid)
            if info is not None and info.si_signo != signal.SIGCHLD:
                if info.si_code != _SI_KERNEL:
                    try:
                        os.kill(pid, info.si_signo)
                    except ProcessLookupError:
                        pass
        ended = time.time()
        # Drain what arrived meanwhile, so unblocking does not raise KeyboardInterrupt here.
        while signal.sigtimedwait(watched, 0) is not None:
            pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return _exit_from_status(status, ended)


def _run_portable(command: Sequence[str], env: dict[str, str], tick: Callable[[int], None]) -> ChildExit:
    try:
        child = subprocess.Popen(list(command), env=env)
    except OSError as exc:
        raise LaunchError(f"cannot start {command[0]}: {exc.strerror}") from None

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    # ^C reaches the child from the terminal itself; forward only what was sent to us.
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
                signal.SIGTERM: signal.signal(signal.SIGTERM, forward)}
    try:
        while True:
            try:
                code = child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                tick(child.pid)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    ended = time.time()
    return ChildExit(None, -code, ended) if code < 0 else ChildExit(code, None, ended)


def _exit_from_status(status: int, ended: float) -> ChildExit:
    if os.WIFSIGNALED(status):
        return ChildExit(None, os.WTERMSIG(status), ended)
    return ChildExit(os.WEXITSTATUS(status), None, ended)


OOM_KILLER_SHARE = 0.8  # last RSS above this share of the machine's memory: likely the OOM killer


def record_killed(db: str, signum: int, host_total: int | None = None) -> None:
    """A ``killed`` event for a child that died by a signal: the signal, the last samples, and
    whether it looks like the kernel's OOM killer (SIGKILL with the last RSS near the machine's
    memory). Best effort: a run file it cannot write is left as it is."""
    import json
    import sqlite3

    from memscope.store.writer import connect_rw

    try:
        if host_total is None:
            import psutil

            host_total = int(psutil.virtual_memory().total)
        conn = connect_rw(db)
    except Exception:
        return
    try:
        last = conn.execute("SELECT proc, t, step, rss FROM samples ORDER BY t DESC LIMIT 1").fetchone()
        rss_total = conn.execute(
            "SELECT sum(rss) FROM samples s WHERE t = (SELECT max(t) FROM samples s2 WHERE s2.proc = s.proc)"
        ).fetchone()[0]
        alloc = conn.execute(
            "SELECT sum(allocated) FROM cuda_samples c WHERE t = "
            "(SELECT max(t) FROM cuda_samples c2 WHERE c2.proc = c.proc AND c2.device = c.device)"
        ).fetchone()[0]
        last_rss = int(rss_total) if rss_total is not None else None
        likely = (signum == signal.SIGKILL and last_rss is not None and host_total > 0
                  and last_rss > OOM_KILLER_SHARE * host_total)
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        message = f"killed by signal {signum} ({name})"
        if likely:
            message = f"killed by signal {signum} (possibly the kernel's OOM killer)"
        data = {"signal": signum, "signal_name": name, "step": last[2] if last else None,
                "last_sample_t": last[1] if last else None, "last_rss": last_rss,
                "last_allocated": int(alloc) if alloc is not None else None,
                "host_total_bytes": host_total, "likely_oom_killer": likely}
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO events (proc, t, step, kind, message, data) VALUES (?, ?, ?, ?, ?, ?)",
                         (last[0] if last else None, time.time(), data["step"], "killed", message,
                          json.dumps(data)))
    except sqlite3.Error:
        pass
    finally:
        conn.close()

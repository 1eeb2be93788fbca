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
from typing import Any, Callable, Sequence

import memscope
from memscope.agent.runtime.config import ENV_DB, ENV_OPTIONS, ENV_PATH, ENV_SKIP_CHILD_OF, ENV_SUPERVISOR
from memscope.runners.workers import WorkerSampler

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(memscope.__file__)), "agent", "runtime", "bootstrap")
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
    interrupted: bool = False  # a ^C (SIGINT) reached the run while it ran

    @property
    def run_status(self) -> str:
        """The run's status word: ``interrupted`` for a run ended by ^C (the child died of
        SIGINT, or caught KeyboardInterrupt and exited non-zero), else killed/finished/failed."""
        if self.signal == signal.SIGINT or (self.interrupted and self.exit_code != 0):
            return "interrupted"
        if self.signal is not None:
            return "killed"
        return "finished" if self.exit_code == 0 else "failed"

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
    env[ENV_SUPERVISOR] = str(os.getpid())  # the agents end their process if this one dies
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


def check_module(name: str, cwd: str | None = None) -> None:
    """For ``attach -m NAME``: raise LaunchError when ``python -m NAME`` would fail with "No
    module named", before a run file is created for it. Found as ``python -m`` would (the
    working directory first), without importing or running anything; a package whose
    ``__init__`` computes its own ``__path__`` is given the benefit of the doubt."""
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        raise LaunchError(f"no module named {name}")
    search: list[str] | None = [cwd or os.getcwd(), *sys.path[1:]]
    for i, part in enumerate(parts):
        qual = ".".join(parts[: i + 1])
        if i == 0 and (part in sys.builtin_module_names
                       or importlib.machinery.FrozenImporter.find_spec(part) is not None):
            return
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            raise LaunchError(f"no module named {qual}")
        if i == len(parts) - 1:
            if spec.submodule_search_locations is not None:  # a package runs its __main__
                main = importlib.machinery.PathFinder.find_spec(
                    "__main__", list(spec.submodule_search_locations))
                if main is None and not _dynamic_path(spec):
                    raise LaunchError(f"no module named {qual}.__main__; '{qual}' is a package "
                                      "and cannot be directly executed")
            return
        if spec.submodule_search_locations is None:
            raise LaunchError(f"no module named {'.'.join(parts[: i + 2])} ({qual} is not a package)")
        if _dynamic_path(spec):
            return
        search = list(spec.submodule_search_locations)


def _dynamic_path(spec: Any) -> bool:
    """A package whose ``__init__`` extends its own ``__path__`` (pkgutil, pkg_resources):
    where its submodules are cannot be told without running it."""
    origin = getattr(spec, "origin", None)
    if not origin or not str(origin).endswith(".py"):
        return origin not in (None, "namespace") and not str(origin).endswith(".py")
    try:
        with open(origin, encoding="utf-8", errors="replace") as f:
            return "__path__" in f.read()
    except OSError:
        return True


WAIT_S = 0.5  # the wait loop's longest sleep (the worker sampler may ask for less)
FIRST_WAIT_S = 0.05  # the first tick comes soon: `meanwhile` runs while the child starts up


def run_child(command: Sequence[str], env: dict[str, str],
              meanwhile: Callable[[], None] | None = None) -> ChildExit:
    """Run ``command`` to its end, forwarding signals. ``meanwhile`` runs once, just after the
    child started (its failures are ignored: it is only a head start)."""
    # DataLoader workers' memory, sampled from outside while we wait (memscope.runners.workers)
    sampler = WorkerSampler(env[ENV_DB]) if env.get(ENV_DB) else None
    sampled: Callable[[int], float] = sampler.tick if sampler is not None else _no_tick
    pending = [meanwhile] if meanwhile is not None else []

    def tick(pid: int) -> float:
        while pending:
            try:
                pending.pop()()
            except Exception:  # noqa: BLE001 - a head start only: the caller imports it again
                pass
        return sampled(pid)
    try:
        if hasattr(signal, "sigtimedwait") and hasattr(os, "posix_spawnp"):
            return _run_linux(command, env, tick)
        return _run_portable(command, env, tick)
    finally:
        if sampler is not None:
            sampler.close()


def _no_tick(pid: int) -> float:
    return WAIT_S


def _run_linux(command: Sequence[str], env: dict[str, str], tick: Callable[[int], float]) -> ChildExit:
    """Block the signals we care about and collect them with sigtimedwait: we learn who sent
    each one, so a ^C the terminal already delivered to the child is not delivered twice."""
    watched = set(_FORWARDED) | {signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    interrupted = False
    try:
        try:
            child = subprocess.Popen(list(command), env=env,
                                     preexec_fn=_child_setup(old_mask, os.getpid()))
        except OSError as exc:
            raise LaunchError(f"cannot start {command[0]}: {exc.strerror}") from None
        except subprocess.SubprocessError as exc:
            raise LaunchError(f"cannot start {command[0]}: {exc}") from None
        pid = child.pid
        wait = FIRST_WAIT_S
        while True:
            info = signal.sigtimedwait(watched, wait)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            # a profiler or debugger attached to this supervisor (py-spy, gdb) wakes the wait
            # with si_signo 0: nothing to forward (os.kill raised EINVAL there)
            if info is not None and info.si_signo in _FORWARDED:
                interrupted = interrupted or info.si_signo == signal.SIGINT
                if info.si_code != _SI_KERNEL:
                    try:
                        os.kill(pid, info.si_signo)
                    except ProcessLookupError:
                        pass
            wait = min(WAIT_S, max(0.01, tick(pid)))  # after forwarding: a tick may import for a while
        child.returncode = 0  # reaped above: Popen must not wait for it again
        ended = time.time()
        # Drain what arrived meanwhile, so unblocking does not raise KeyboardInterrupt here.
        while (info := signal.sigtimedwait(watched, 0)) is not None:
            interrupted = interrupted or info.si_signo == signal.SIGINT
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    result = _exit_from_status(status, ended)
    result.interrupted = interrupted
    return result


_PR_SET_PDEATHSIG = 1


def _child_setup(mask: set[int | signal.Signals], parent: int) -> Any:
    """What the child does between fork and exec: take the original signal mask back and ask
    the kernel to SIGKILL it when this supervisor dies (a SIGKILLed ``memscope attach`` must
    not leave the training running unsupervised under init, its run file saying ``running``).
    Only the direct child: the agent in each instrumented process watches the supervisor too."""
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
        except (OSError, AttributeError):
            prctl = None

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:  # the supervisor died before the request took
                os._exit(128 + int(signal.SIGKILL))

    return setup


def _run_portable(command: Sequence[str], env: dict[str, str], tick: Callable[[int], float]) -> ChildExit:
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
        wait = FIRST_WAIT_S
        while True:
            try:
                code = child.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                wait = min(WAIT_S, max(0.01, tick(child.pid)))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    ended = time.time()
    return ChildExit(None, -code, ended) if code < 0 else ChildExit(code, None, ended)


def _exit_from_status(status: int, ended: float) -> ChildExit:
    if os.WIFSIGNALED(status):
        return ChildExit(None, os.WTERMSIG(status), ended)
    return ChildExit(os.WEXITSTATUS(status), None, ended)


LOW_SPACE_BYTES = 256 * 1024  # less free than this beside a run file: the disk is the suspect


def storage_problem(db: str) -> str | None:
    """What is wrong with where the run file lives, if anything: a full disk, a read-only
    file system, a directory or file this process may no longer write. Checked after the
    child ended, to explain a record that stopped early (and to say it on stderr)."""
    path = os.path.abspath(db)
    parent = os.path.dirname(path)
    try:
        st = os.statvfs(parent)
    except OSError as exc:
        return f"cannot look at {parent} ({exc.strerror})"
    if st.f_flag & getattr(os, "ST_RDONLY", 1):
        return f"{parent} is on a read-only file system"
    free = st.f_bavail * st.f_frsize
    if free < LOW_SPACE_BYTES:
        return f"the disk holding {parent} is full ({free // 1024} KiB free)"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"the directory {parent} is not writable"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{path} is not writable"
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        limit = -1
    if limit not in (-1, getattr(resource, "RLIM_INFINITY", -1)):
        sizes = [os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s)]
        if sizes and max(sizes) + 64 * 1024 >= limit:
            return f"the file size limit (ulimit -f) of {limit // 1024} KiB is reached"
    return None


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

"""The processes of this host that have torch loaded, found from /proc without touching them.

A process is known by its pid and its start time (a pid is reused; the pair is not). Whether it
has torch loaded is read once from its memory map (:func:`memscope.node.target.torch_loaded`):
torch is never unloaded, so a torch process is not read again; a process without it is looked at
again every ``RESCAN_S`` seconds (it may import torch later). A process whose map this user may
not read (another user's, without root) is listed as unreadable when its command line looks like
Python, with why: memscope cannot tell whether it has torch, and never touches it.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

from memscope.node.commands import shown_argv
from memscope.node.target import (_stat_fields, _status, boot_time, open_run_files, start_time,
                                  torch_loaded, user_name)

RESCAN_S = 30.0  # how often a process without torch is looked at again
_PYTHON_ARGV0 = re.compile(r"(^|/)(python[0-9.]*|pypy[0-9.]*|torchrun|accelerate|deepspeed)$")


@dataclass
class Found:
    """A process with torch loaded."""

    pid: int
    started: float  # unix seconds: with the pid, who this process is
    uid: int
    user: str
    argv: list[str]  # redacted (memscope.node.commands)
    run_file: str | None = None  # the memscope run file it holds open, if it is recorded

    @property
    def command(self) -> str:
        return " ".join(self.argv)


@dataclass
class Unreadable:
    """A Python-looking process whose memory map this user may not read."""

    pid: int
    uid: int
    user: str
    command: str
    why: str


@dataclass
class _Known:
    torch: bool
    checked: float
    found: Found | None = None


@dataclass
class Discovery:
    """Finds the torch processes of this host, scan after scan, remembering what it learned."""

    rescan_s: float = RESCAN_S
    _known: dict[tuple[int, int], _Known] = field(default_factory=dict)
    _boot: float | None = None
    _fds: dict[tuple[int, int, int, int], bool] = field(default_factory=dict)  # open_run_files' memory

    def scan(self, now: float | None = None) -> tuple[list[Found], list[Unreadable]]:
        """The torch processes now (their run files read afresh), and the unreadable ones."""
        now = time.time() if now is None else now
        me = os.getpid()
        found: list[Found] = []
        unreadable: list[Unreadable] = []
        alive: set[tuple[int, int]] = set()
        for name in _pids():
            pid = int(name)
            if pid == me:
                continue
            ticks = _start_ticks(pid)
            if ticks is None:
                continue  # gone meanwhile, or a kernel thread's odd stat
            key = (pid, ticks)
            alive.add(key)
            known = self._known.get(key)
            if known is None or (not known.torch and now - known.checked >= self.rescan_s):
                known, why = self._look(pid, ticks, now)
                if why is not None:
                    unreadable.append(why)
                    continue
                self._known[key] = known
            if known.torch and known.found is not None:
                known.found.run_file = self._run_file(pid)
                found.append(known.found)
        for key in [k for k in self._known if k not in alive]:
            del self._known[key]  # ended: its pid may come back as another process
        return found, unreadable

    def _look(self, pid: int, ticks: int, now: float) -> tuple[_Known, Unreadable | None]:
        try:
            uid = _uid(pid)
            argv = _argv(pid)
        except (OSError, KeyError, IndexError, ValueError):
            return _Known(False, now), None
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                maps = f.read().decode("utf-8", "replace")
        except PermissionError:
            if argv and _PYTHON_ARGV0.search(argv[0]):
                user = user_name(uid)
                return _Known(False, now), Unreadable(
                    pid, uid, user, " ".join(shown_argv(argv)),
                    f"cannot read its memory map: a process of {user}, and memscope runs as "
                    f"{user_name(os.geteuid())} (root sees whether it has torch)")
            return _Known(False, now), None
        except OSError:
            return _Known(False, now), None
        if not torch_loaded(maps):
            return _Known(False, now), None
        started = self._boot_time() + ticks / os.sysconf("SC_CLK_TCK")
        return _Known(True, now, Found(pid, started, uid, user_name(uid), shown_argv(argv))), None

    def _run_file(self, pid: int) -> str | None:
        if len(self._fds) > 65536:  # files opened and closed over days: start again
            self._fds.clear()
        files = open_run_files(pid, self._fds)
        return files[0] if files else None

    def _boot_time(self) -> float:
        if self._boot is None:
            self._boot = boot_time()
        return self._boot


def _pids() -> list[str]:
    return [n for n in os.listdir("/proc") if n.isdigit()]


def _start_ticks(pid: int) -> int | None:
    try:
        return int(_stat_fields(pid)[19])
    except (OSError, IndexError, ValueError):
        return None


def _uid(pid: int) -> int:
    return int(_status(pid)["Uid"].split()[1])  # effective, as memscope.node.target reads it


def _argv(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a for a in f.read().decode("utf-8", "replace").split("\0") if a]




def alive(pid: int, started: float) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` (not a reused pid)."""
    try:
        return abs(start_time(pid) - started) < 1.0
    except (OSError, IndexError, ValueError):
        return False

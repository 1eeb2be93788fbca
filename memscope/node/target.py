"""What a running process is, read from /proc, before memscope touches it.

``memscope attach --pid`` refuses, in one line, every process it cannot or must not inject:
one that does not exist, is not CPython 3.10+, has not imported torch, belongs to another user
(without root), is stopped (Ctrl-Z) or already traced by a debugger, runs in another PID or mount
namespace (a container), or is already recorded by memscope. Everything here is a read of
/proc: nothing is sent to the process.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from dataclasses import dataclass, field

from memscope.store.runs import is_run_file

# a CPython extension module's ABI tag (``_C.cpython-311-x86_64-linux-gnu.so``) or its library
_CPYTHON_TAG = re.compile(r"\.cpython-3(\d+)[a-z]*-")
_LIBPYTHON = re.compile(r"/libpython3\.(\d+)[a-z]*\.so")
_EXE = re.compile(r"(?:^|/)python3\.(\d+)[a-z]*$")
# what torch's extension leaves in the maps of a process that imported it
_TORCH_LIBS = ("/libtorch_python.so", "/torch/_C.cpython-", "/libtorch_cpu.so")


class TargetError(Exception):
    """Why memscope will not attach to a process: one line for the user."""


@dataclass
class Target:
    pid: int
    uid: int
    user: str
    exe: str
    argv: list[str]
    python: tuple[int, int]
    started: float  # when the process started, unix seconds
    state: str  # /proc/PID/stat's state letter
    run_files: list[str] = field(default_factory=list)  # memscope run files it holds open

    @property
    def command(self) -> str:
        return " ".join(self.argv) or self.exe


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def _status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in _read(f"/proc/{pid}/status").splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def _stat_fields(pid: int) -> list[str]:
    text = _read(f"/proc/{pid}/stat")
    return text[text.rfind(")") + 2:].split()  # the name in parentheses may hold anything


def boot_time() -> float:
    for line in _read("/proc/stat").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def start_time(pid: int) -> float:
    """When ``pid`` started, in unix seconds (stat's starttime after the boot)."""
    ticks = int(_stat_fields(pid)[19])
    return boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def python_version(maps: str, exe: str) -> tuple[int, int] | None:
    """CPython's version from what the process mapped: libpython, an extension module's ABI tag,
    or the executable's name; None when nothing says CPython."""
    for pattern in (_LIBPYTHON, _CPYTHON_TAG):
        found = pattern.search(maps)
        if found:
            return 3, int(found.group(1))
    found = _EXE.search(exe)
    return (3, int(found.group(1))) if found else None


def torch_loaded(maps: str) -> bool:
    """Whether torch's code is mapped to run (an ``r-xp`` segment), not only read: a debugger that
    read libtorch's symbols (gdb or lldb attaching to a training) maps the file too, never to run."""
    for line in maps.splitlines():
        if any(lib in line for lib in _TORCH_LIBS):
            fields = line.split(None, 5)
            if len(fields) > 1 and "x" in fields[1]:
                return True
    return False


def open_run_files(pid: int, seen: dict[tuple[int, int, int, int], bool] | None = None) -> list[str]:
    """The memscope run files ``pid`` holds open (its agent's connection), by /proc/PID/fd.

    Only regular files are opened to read their header: opening a FIFO the process holds would
    block until someone writes to it (a device file may do anything). ``seen``: what earlier calls
    found of each file, unchanged since ((st_dev, st_ino, st_size, st_mtime_ns) -> a run file or
    not), so a process with thousands of open files (a dataset) costs a stat each, not an open and
    a read, on every look."""
    found: list[str] = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        link = f"/proc/{pid}/fd/{fd}"
        try:
            path = os.readlink(link)
            st = os.stat(link)
        except OSError:
            continue
        if (not path.startswith("/") or path.endswith(("-wal", "-shm", "-journal")) or path in found
                or not stat.S_ISREG(st.st_mode)):
            continue
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        known = seen.get(key) if seen is not None else None
        if known is None:
            known = is_run_file(link)
            if seen is not None:
                seen[key] = known
        if known:
            found.append(path)
    return found


def _namespace(pid: int | str, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def ptrace_scope() -> int | None:
    try:
        return int(_read("/proc/sys/kernel/yama/ptrace_scope").strip())
    except (OSError, ValueError):
        return None


def _may_trace(uid: int) -> str | None:
    """Why this process may not ptrace a process of ``uid``, or None."""
    me = os.geteuid()
    if me == 0:
        scope = ptrace_scope()
        return ("kernel.yama.ptrace_scope is 3: no process may be traced on this machine "
                "(it can only be lowered by a reboot)") if scope == 3 else None
    if uid != me:
        return (f"it belongs to user {user_name(uid)}, and memscope runs as {user_name(me)}: attach "
                f"to your own processes, or run memscope as root (or with CAP_SYS_PTRACE)")
    scope = ptrace_scope()
    if scope in (1, 2, 3):
        why = {1: "only a parent may trace its children", 2: "only root (CAP_SYS_PTRACE) may trace",
               3: "no process may be traced"}[scope]
        return (f"kernel.yama.ptrace_scope is {scope} ({why}): run memscope as root, give it "
                f"CAP_SYS_PTRACE, or lower it with `sysctl kernel.yama.ptrace_scope=0`")
    return None


def inspect(pid: int) -> Target:
    """The facts about ``pid``; raises TargetError (one line) when memscope must not attach."""
    if pid <= 0 or pid == os.getpid():
        raise TargetError(f"pid {pid}: not a process memscope can attach to")
    if not os.path.isdir(f"/proc/{pid}"):
        raise TargetError(f"no such process: {pid}")
    try:
        status = _status(pid)
        fields = _stat_fields(pid)
    except FileNotFoundError:
        raise TargetError(f"no such process: {pid}") from None
    except OSError as exc:
        raise TargetError(f"pid {pid}: cannot read /proc/{pid} ({exc.strerror})") from None
    uid = int(status.get("Uid", "0").split()[1])  # effective
    state = fields[0]
    if state == "Z":
        raise TargetError(f"pid {pid} has exited (a zombie its parent has not reaped)")
    why = _may_trace(uid)
    if why:
        raise TargetError(f"no permission to trace pid {pid}: {why}")
    tracer = int(status.get("TracerPid", "0") or 0)
    if tracer:
        raise TargetError(f"pid {pid} is already traced by pid {tracer} (a debugger); detach it first")
    if state in ("T", "t"):
        raise TargetError(f"pid {pid} is stopped (Ctrl-Z or SIGSTOP): resume it first (`kill -CONT {pid}` "
                          "or `fg` in its shell); memscope injects at a point the running interpreter reaches")
    for kind, what in (("pid", "PID"), ("mnt", "mount")):
        mine, theirs = _namespace("self", kind), _namespace(pid, kind)
        if mine and theirs and mine != theirs:
            raise TargetError(f"pid {pid} runs in another {what} namespace (a container): run memscope "
                              f"inside it (`docker exec -it CONTAINER memscope attach --pid PID`, with "
                              f"the pid as the container sees it), where memscope is installed beside torch")
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        maps = _read(f"/proc/{pid}/maps")
        argv = [a for a in _read(f"/proc/{pid}/cmdline").split("\0") if a]
    except OSError as exc:
        raise TargetError(f"pid {pid}: cannot read its memory map ({exc.strerror})") from None
    version = python_version(maps, exe)
    if version is None:
        raise TargetError(f"pid {pid} ({os.path.basename(exe)}) is not a CPython process")
    if version < (3, 10):
        raise TargetError(f"pid {pid} runs Python 3.{version[1]}; memscope attaches to Python 3.10 or newer")
    if not torch_loaded(maps):
        raise TargetError(f"pid {pid} ({os.path.basename(exe)}) has not imported torch; memscope "
                          "attaches to a process that has")
    target = Target(pid=pid, uid=uid, user=user_name(uid), exe=exe, argv=argv, python=version,
                    started=start_time(pid), state=state, run_files=open_run_files(pid))
    if target.run_files:
        raise TargetError(f"pid {pid} is already recorded by memscope into {target.run_files[0]}")
    return target

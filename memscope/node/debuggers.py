"""Putting a few lines of Python into a running CPython 3.10-3.13, through gdb or lldb.

What the debugger does, and nothing more (the rest happens inside the interpreter, when it
chooses):

1. attach (every thread stops where it is);
2. ``mmap`` one anonymous page (a system call: no lock taken, safe wherever a thread stopped,
   where ``malloc`` would not be: the thread may be inside malloc);
3. write the bootstrap's text into the page (a memory write, no code runs);
4. ``Py_AddPendingCall(PyRun_SimpleString, page)``: documented as callable from any thread
   without the GIL; the interpreter's main thread runs the pending call between two bytecodes,
   GIL held, never inside malloc or the collector's C code;
5. detach. The training goes on at once; the text runs at its next bytecode boundary.

The interpreter is never made to run Python from the stopped thread: the debugger calls two C
functions, each bounded (gdb's ``unwindonsignal``, lldb's expression timeout), then lets go.

A debugger that cannot restore a thread's registers would leave the target broken (gdb 13 on a
CPU with AMX state: "Couldn't write extended state status: Bad address", after which the
interrupted system call returned errno 514 into the program). So each debugger is first tried
on a throwaway ``sleep`` process of memscope's own, with the same kind of call; one that fails
there never touches the target.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

PAGE = 16384  # the mmap for the bootstrap text (four pages: the options travel in it)
RUN_BOUND_S = 90.0  # a debugger reading a large libtorch's symbols takes seconds, not minutes
_CALL_TIMEOUT_US = 10_000_000  # lldb: one expression at most this long, then unwound
_HEX = re.compile(r"0x[0-9a-fA-F]+")

GDB_SCRIPT = """\
set confirm off
set pagination off
set unwindonsignal on
sharedlibrary libc
sharedlibrary libpython
set $memscope_page = ((void*(*)(void*, unsigned long, int, int, int, long))mmap)(0, {page}, 3, 34, -1, 0)
if $memscope_page == (void*)-1
  echo memscope: mmap failed\\n
  quit 3
end
printf "memscope: page %p\\n", $memscope_page
restore {code} binary $memscope_page
set $memscope_rc = ((int(*)(void*, void*))Py_AddPendingCall)((void*)PyRun_SimpleString, $memscope_page)
printf "memscope: pending call %d\\n", $memscope_rc
detach
quit
"""

LLDB_SCRIPT = """\
settings set interpreter.stop-command-source-on-error true
expr -t {timeout} -- void* $memscope_page = (void*)mmap(0, {page}, 3, 34, -1, 0)
p $memscope_page
memory write -i {code} $memscope_page
expr -t {timeout} -- void* $memscope_f = (void*)PyRun_SimpleString
expr -t {timeout} -- void* $memscope_g = (void*)Py_AddPendingCall
expr -t {timeout} -- int $memscope_rc = ((int(*)(void*, void*))$memscope_g)($memscope_f, $memscope_page)
p $memscope_rc
detach
"""

GDB_PROBE = ["-ex", "sharedlibrary libc", "-ex", "p ((int(*)(void))getpid)()", "-ex", "detach"]
LLDB_PROBE = ["-o", f"expr -t {_CALL_TIMEOUT_US} -- (int)getpid()", "-o", "detach"]


class InjectError(Exception):
    """Why the bootstrap could not be put into the process: one line."""


class Interrupted(KeyboardInterrupt):
    """^C while the debugger ran; it was stopped, and what it printed is kept."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self.output = output


@dataclass
class Injected:
    debugger: str
    page: int  # the page holding the bootstrap's text, in the target
    output: str


def _gdb_command(pid: int, *extra: str) -> list[str]:
    return ["gdb", "-q", "-batch", "-nx", "-nw", "-iex", "set auto-solib-add off", "-p", str(pid), *extra]


def _lldb_command(pid: int, *extra: str) -> list[str]:
    return ["lldb", "--batch", "--no-lldbinit", "-p", str(pid), *extra]


def _run(cmd: list[str], timeout: float) -> tuple[int, str]:
    """Run a debugger, bounded: past ``timeout`` it gets SIGINT (an inferior call is unwound, the
    registers restored), then SIGTERM; the output says what happened."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}  # its own Python
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except KeyboardInterrupt:
        # ^C to memscope: the debugger (in its own session, it saw none) is let finish, never
        # killed: killed between saving a thread's registers and restoring them, it would leave
        # that thread running from the middle of a function call. Each of its calls is bounded.
        sys.stderr.write("memscope: interrupted; letting the debugger finish with the process first "
                         "(it restores the thread it stopped)\n")
        raise Interrupted(_finish(proc, timeout)) from None
    except subprocess.TimeoutExpired:
        return -1, _stop(proc, timeout)


def _finish(proc: subprocess.Popen[str], timeout: float) -> str:
    """Wait for a debugger to end by itself (bounded), whatever more ^C come meanwhile."""
    until = time.monotonic() + timeout
    while True:
        try:
            out, _ = proc.communicate(timeout=max(0.1, until - time.monotonic()))
            return out or ""
        except KeyboardInterrupt:
            continue
        except subprocess.TimeoutExpired:
            return _stop(proc, timeout)


def _stop(proc: subprocess.Popen[str], timeout: float) -> str:
    """End a debugger stuck past its bound: SIGINT first (an inferior call is unwound, the
    registers restored; it then detaches), then SIGTERM, then SIGKILL, each after a grace."""
    for sig, grace in ((signal.SIGINT, 10.0), (signal.SIGTERM, 5.0)):
        try:
            proc.send_signal(sig)
            out, _ = proc.communicate(timeout=grace)
            return (out or "") + f"\n(memscope: the debugger was stopped after {timeout:.0f} s or a ^C)"
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:  # a second ^C: on to the next signal
            continue
    proc.kill()
    out, _ = proc.communicate()
    return (out or "") + "\n(memscope: the debugger was killed)"


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()[0]


def _wake_if_stopped(pid: int) -> None:
    """lldb sometimes leaves its target stopped when it exits (memray's users saw it too); the
    target was running before (a stopped one is refused), so it is woken."""
    for _ in range(20):
        if _state(pid) not in ("T", "t"):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        pass


def probe(debugger: str) -> str | None:
    """Why ``debugger`` cannot safely call a function in a process here (None: it can), tried on
    a ``sleep`` process memscope starts and ends itself."""
    if shutil.which(debugger) is None:
        return f"{debugger} is not installed"
    dummy = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.05)  # let it reach its sleep
        cmd = _gdb_command(dummy.pid, *GDB_PROBE) if debugger == "gdb" else _lldb_command(dummy.pid, *LLDB_PROBE)
        _rc, out = _run(cmd, 30.0)
        if debugger == "lldb":
            _wake_if_stopped(dummy.pid)
        broken = dummy.poll() is not None or _state(dummy.pid) in ("T", "t")
        if f"= {dummy.pid}" in out and not broken:
            return None
        last = [line.strip() for line in out.splitlines() if "rror" in line or "ouldn't" in line]
        return (f"{debugger} could not call a function in a test process"
                f"{': ' + last[0] if last else ''}")
    finally:
        dummy.kill()
        dummy.wait()


def choose(wanted: str) -> str:
    """The debugger to use: ``wanted`` (gdb or lldb), or with ``auto`` gdb, else lldb; each only
    if its probe passes. Raises InjectError saying what to install."""
    order = ["gdb", "lldb"] if wanted == "auto" else [wanted]
    problems = []
    for name in order:
        why = probe(name)
        if why is None:
            return name
        problems.append(why)
    if all("not installed" in p for p in problems):
        names = " or ".join(order)
        raise InjectError(f"{names} is needed to attach to a running Python before 3.14: install it "
                          f"(`apt-get install gdb lldb`, `dnf install gdb lldb`) and try again")
    return _refuse(problems)


def _refuse(problems: list[str]) -> str:
    hint = ("; gdb older than 14 cannot restore the registers of CPUs with AMX state: install lldb "
            "(`apt-get install lldb`) or a newer gdb") if any("extended state" in p for p in problems) else ""
    raise InjectError("; ".join(problems) + hint)


def inject(pid: int, code: bytes, debugger: str, timeout: float = RUN_BOUND_S) -> Injected:
    """Queue ``code`` (Python source) as a pending call in ``pid`` through ``debugger``."""
    if len(code) >= PAGE:
        raise InjectError(f"the bootstrap is {len(code)} bytes; it must fit in {PAGE - 1}")
    with tempfile.TemporaryDirectory(prefix="memscope-inject-") as tmp:
        code_file = os.path.join(tmp, "bootstrap.bin")
        script = os.path.join(tmp, "inject.cmd")
        fd = os.open(code_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(code + b"\0")
        # the debugger runs as this user; it reads the files, the target never does
        if debugger == "gdb":
            text = GDB_SCRIPT.format(page=PAGE, code=code_file)
        else:
            text = LLDB_SCRIPT.format(page=PAGE, code=code_file, timeout=_CALL_TIMEOUT_US)
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        cmd = _gdb_command(pid, "-x", script) if debugger == "gdb" else _lldb_command(pid, "-s", script)
        try:
            rc, out = _run(cmd, timeout)
        except Interrupted as exc:  # a bootstrap queued before the ^C must not run later
            try:
                neutralize(pid, _parse(pid, debugger, exc.output))
            except InjectError:
                pass
            raise KeyboardInterrupt from None
        finally:
            if debugger == "lldb":
                _wake_if_stopped(pid)
    return Injected(debugger, _parse(pid, debugger, out), out)


def _parse(pid: int, debugger: str, out: str) -> int:
    """The page's address once the pending call is queued; else InjectError with the cause."""
    page = None
    queued = False
    for line in out.splitlines():
        if debugger == "gdb":
            found = _HEX.search(line) if line.startswith("memscope: page ") else None
            if found is not None:
                page = int(found.group(0), 16)
            queued = queued or line.strip() == "memscope: pending call 0"
        else:
            if "$memscope_page = " in line and _HEX.search(line):
                page = int(_HEX.findall(line)[-1], 16)
            queued = queued or re.search(r"\$memscope_rc = 0\b", line) is not None
    if page is not None and queued:
        return page
    if not os.path.isdir(f"/proc/{pid}"):
        raise InjectError(f"pid {pid} ended while memscope attached to it")
    lowered = out.lower()
    if "operation not permitted" in lowered or "attach failed" in lowered or "ptrace" in lowered:
        raise InjectError(f"{debugger} could not attach to pid {pid} (ptrace refused: another user's "
                          "process, kernel.yama.ptrace_scope, or a missing CAP_SYS_PTRACE)")
    if "no symbol" in lowered or "undeclared identifier" in lowered or "undefined" in lowered:
        raise InjectError(f"pid {pid}: {debugger} found no Py_AddPendingCall/PyRun_SimpleString in it "
                          "(a Python built without its dynamic symbols?)")
    if page is not None and not queued:
        raise InjectError(f"pid {pid}: the interpreter refused the pending call (its queue is full); "
                          "try again in a moment")
    errors = [line.strip() for line in out.splitlines() if "rror" in line or "ouldn't" in line]
    raise InjectError(f"{debugger} could not inject into pid {pid}"
                      f"{': ' + errors[-1] if errors else ''}")


def neutralize(pid: int, page: int) -> bool:
    """Turn a queued bootstrap that has not run yet into a comment (its first byte becomes ``#``),
    so that it does nothing when the interpreter gets to it. One write to /proc/PID/mem: no
    thread is stopped. Whether the write was made."""
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_WRONLY)
    except OSError:
        return False
    try:
        return os.pwrite(fd, b"#", page) == 1
    except OSError:
        return False
    finally:
        os.close(fd)

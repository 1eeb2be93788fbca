"""``memscope attach --pid``: one line and exit 2 for every process it must not touch, a target
blocked in a C call left running, and the pending-call text's own guards.

(The refusals that need a running torch training — no debugger, a stopped target, one already
recorded — are in tests/test_attach_pid.py, asked of its training.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS, memscope
from memscope.node.bootstrap_text import pending_call
from memscope.store.runs import create_run


def _one_line(out: subprocess.CompletedProcess[str], *needles: str, said: int = 0) -> None:
    """Exit 2 and one error line (after ``said`` lines of progress), naming ``needles``."""
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == said + 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[-1].startswith("memscope: error: ")
    for needle in needles:
        assert needle in lines[-1], out.stderr


def _sleeper(*cmd: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    time.sleep(0.3)
    return proc


def test_no_such_process_not_cpython_no_torch(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    _one_line(memscope("attach", "--pid", str(gone.pid), "--db", str(tmp_path / "a.db")),
              f"no such process: {gone.pid}")
    sleeper = _sleeper("sleep", "30")
    plain_python = _sleeper(sys.executable, "-c", "import time; time.sleep(30)")
    try:
        _one_line(memscope("attach", "--pid", str(sleeper.pid), "--db", str(tmp_path / "a.db")),
                  f"pid {sleeper.pid} (sleep) is not a CPython process")
        _one_line(memscope("attach", "--pid", str(plain_python.pid), "--db", str(tmp_path / "a.db")),
                  f"pid {plain_python.pid}", "has not imported torch")
    finally:
        sleeper.kill()
        plain_python.kill()
    assert not (tmp_path / "a.db").exists()
    script = str(SCRIPTS / "attach_target.py")
    _one_line(memscope("attach", "--pid", "12", script), "give --pid PID or a command to start, not both")
    _one_line(memscope("attach", "--duration", "3", script), "--duration goes with --pid")
    _one_line(memscope("detach", str(gone.pid)), "no such process")


def test_another_users_process(tmp_path: Path) -> None:
    """As uid nobody (a real second user, through setpriv), root's process is refused before
    anything is tried on it. nobody runs the system's Python on the source tree: the venv's lives
    under /root, which nobody cannot enter."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a second user (setpriv); the suite runs as root in CI")
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed for the second-user tests"
    system_python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)), None)
    assert system_python, "a system Python the second user can run is needed"
    sleeper = _sleeper("sleep", "30")
    shared = Path("/tmp") / f"memscope-nobody-{os.getpid()}"
    shared.mkdir(mode=0o777, exist_ok=True)
    shared.chmod(0o777)
    try:
        out = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", system_python,
                              "-m", "memscope", "attach", "--pid", str(sleeper.pid), "--db",
                              str(shared / "x.db")], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             capture_output=True, text=True, timeout=60)
    finally:
        sleeper.kill()
    _one_line(out, f"no permission to trace pid {sleeper.pid}", "belongs to user root",
              "runs as nobody", "CAP_SYS_PTRACE")
    assert not (shared / "x.db").exists()
    shutil.rmtree(shared, ignore_errors=True)


def test_process_in_another_namespace(tmp_path: Path) -> None:
    """A process in a container (here: a PID and mount namespace made with unshare, which needs
    root) is refused, and the line says where to run memscope instead."""
    if os.geteuid() != 0:
        pytest.skip("unshare --pid needs root")
    unshare = shutil.which("unshare")
    assert unshare, "unshare (util-linux) is needed for the container test"
    outer = subprocess.Popen([unshare, "--pid", "--fork", "--mount-proc", "sleep", "30"])
    try:
        inner = None
        for _ in range(100):
            kids = Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()
            if kids:
                inner = int(kids[0])
                break
            time.sleep(0.05)
        assert inner is not None
        _one_line(memscope("attach", "--pid", str(inner), "--db", str(tmp_path / "c.db")),
                  "runs in another PID namespace (a container)", "docker exec")
    finally:
        outer.kill()
        outer.wait()


def test_blocked_target_is_left_running_untouched(tmp_path: Path) -> None:
    """A main thread inside one long C call never reaches a bytecode: past --attach-timeout the
    queued bootstrap is turned into a comment (its first byte ``#``), the run file removed, and
    the training later goes on without memscope ever starting in it."""
    from memscope.node import debuggers

    try:
        debuggers.choose("auto")
    except debuggers.InjectError as exc:
        pytest.fail(f"no debugger can inject here: {exc} (make test-deps installs lldb)")
    fifo = tmp_path / "unblock"
    os.mkfifo(fifo)
    target = subprocess.Popen([sys.executable, str(SCRIPTS / "attach_target.py"), "--steps", "20",
                               "--block-at", "0", "--block-fifo", str(fifo)], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT)
    assert target.stdout is not None
    assert target.stdout.readline().strip() == "at step 0"
    # ^C to the attach command while it injects: the debugger is stopped, the target let go
    interrupted = subprocess.Popen([sys.executable, "-m", "memscope", "attach", "--pid", str(target.pid),
                                    "--headless", "--db", str(tmp_path / "int.db")], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)
    interrupted.send_signal(signal.SIGINT)
    _out, err = interrupted.communicate(timeout=60)
    assert interrupted.returncode == 130 and "Traceback" not in err, err
    assert not (tmp_path / "int.db").exists()
    assert _tracer(target.pid) == 0 and target.poll() is None
    db = tmp_path / "blocked.db"
    out = memscope("attach", "--pid", str(target.pid), "--headless", "--db", str(db),
                   "--attach-timeout", "2")
    assert target.poll() is None, (target.returncode, out.stderr)
    _one_line(out, f"pid {target.pid} did not reach a point where Python runs within 2 s",
              "left it running and cancelled its bootstrap", said=1)
    assert not db.exists()
    assert target.poll() is None  # still running (blocked), not killed
    queued = _queued_texts(target.pid)  # the interrupted attach's too, if it got that far
    assert queued and set(queued) == {b"#xec("}  # every queued line is a comment now
    with open(fifo, "wb") as unblock:  # the C call returns: the training goes on
        unblock.write(b"x")
    rest, _ = target.communicate(timeout=120)
    assert target.returncode == 0
    state = json.loads(rest.split("STATE ", 1)[1])
    assert state["memscope_imported"] is False
    assert not any("memscope" in t for t in state["threads"])


def _tracer(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("TracerPid:"):
            return int(line.split()[1])
    return -1


def _queued_texts(pid: int) -> list[bytes]:
    """The first bytes of every page holding a queued line: the bootstrap's mmap is anonymous
    and read-write, and the kernel merges it with an adjacent mapping of the same kind (the
    interrupted attach's page, when it got that far: one 32 KiB mapping, which a search for
    mappings of the bootstrap's size missed under load), so every page of such mappings is
    looked at."""
    found = []
    step = os.sysconf("SC_PAGE_SIZE")
    with open(f"/proc/{pid}/mem", "rb") as mem:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            fields = line.split()
            if len(fields) > 5 or not fields[1].startswith("rw"):
                continue  # a file's mapping, or the stack and heap's named ones
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            for at in range(lo, hi, step):
                mem.seek(at)
                try:
                    head = mem.read(5)
                except OSError:
                    continue
                if head[1:] == b"xec(":
                    found.append(head)
    return found


def test_pending_call_guards(tmp_path: Path) -> None:
    """The queued text, run here as the interpreter would run it: it binds no name in the
    namespace it runs in, starts nothing past its deadline, and a failure in its thread lands in
    the run file as ``attach_failed`` (never on the training's stderr)."""
    db = tmp_path / "g.db"
    create_run(str(db), ["python", "x.py"])
    st = os.stat(db)
    base = {"db": str(db), "db_id": [st.st_dev, st.st_ino], "supervisor": os.getpid(),
            "process_started": time.time(), "max_steps": 0, "options": {}}
    namespace: dict[str, object] = {}
    line = pending_call({**base, "deadline": time.time() - 1})
    assert b"\n" not in line
    before = {t.name for t in threading.enumerate()}
    exec(line.decode(), namespace)  # noqa: S102 - what PyRun_SimpleString does with it
    assert set(namespace) == {"__builtins__"}
    time.sleep(0.3)
    assert {t.name for t in threading.enumerate()} == before  # past the deadline: no thread
    text = pending_call({**base, "deadline": time.time() + 60}).decode()
    text = text.replace("attach-boot.py", "no-such-boot.py")  # the thread's read fails
    exec(text, {})  # noqa: S102
    for _ in range(50):
        rows = sqlite3.connect(db).execute("SELECT message FROM events WHERE kind = 'attach_failed'").fetchall()
        if rows:
            break
        time.sleep(0.1)
    assert rows and "no-such-boot.py" in rows[0][0]
    neutral = "#" + line.decode()[1:]
    exec(neutral, {})  # noqa: S102 - a comment: runs nothing, raises nothing


def test_another_memscope_in_the_target_is_refused(tmp_path: Path) -> None:
    """The bootstrap as the injected thread runs it, in a process that imported another memscope
    (another version, from another place): it refuses in one line, before importing anything."""
    from memscope.node.bootstrap_text import BOOT_FILE, ROOT as HERE

    other = tmp_path / "site" / "memscope"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text('__version__ = "0.0.1"\n')
    db = tmp_path / "v.db"
    create_run(str(db), ["python", "x.py"])
    st = os.stat(db)
    args = {"db": str(db), "db_id": [st.st_dev, st.st_ino], "root": HERE, "version": "0.1.0"}
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import memscope; "
            "exec(compile(open(sys.argv[2]).read(), sys.argv[2], 'exec'), {'ARGS': json.loads(sys.argv[3])})")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site"), BOOT_FILE, json.dumps(args)],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == (f"RuntimeError: this process already imported memscope 0.0.1 from {tmp_path / 'site'}; "
                    f"the command is memscope 0.1.0 from {HERE}: attach with that one"), out.stderr

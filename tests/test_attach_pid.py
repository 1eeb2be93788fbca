"""``memscope attach --pid`` / ``memscope detach`` on real trainings started with plain python.

One training (tests/scripts/attach_target.py, a 64 KiB leak a step) is attached three times at
default options, each time detached another way: ``memscope detach PID``, ``--max-steps``, ^C to
the attach command. The first attach comes after ~50 of its steps, so the leak began before it.
The training then runs to its end; its losses' digest and what it finds in itself (threads,
hooks, patched functions, trace functions) are compared with a plain run of the same script. The
refusals that need a running torch process (no debugger on PATH, a stopped target, one already
recorded) are asked of the same training while it runs.

The debugger is real (gdb, else lldb: on CPUs with AMX state gdb 13 cannot restore registers and
memscope's probe falls back to lldb); where neither works the tests fail saying why.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, SCRIPTS, memscope, report_json
from memscope.node.target import open_run_files

TARGET = SCRIPTS / "attach_target.py"
STEPS = 3000  # at 10 ms a step while attaches happen; then fast (--fast-file)
pytestmark = pytest.mark.slow


def _debugger_works() -> None:
    from memscope.node import debuggers

    try:
        debuggers.choose("auto")
    except debuggers.InjectError as exc:
        pytest.fail(f"no debugger can inject here: {exc} (make test-deps installs lldb)")


class Target:
    """A training process with its stdout read line by line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(TARGET), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self.lines: list[str] = []
        self._seen = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                self._seen.notify_all()

    def wait_line(self, text: str, timeout: float = 60) -> None:
        with self._seen:
            assert self._seen.wait_for(lambda: any(text == ln for ln in self.lines), timeout), self.lines[-3:]

    def wait_line_prefix(self, prefix: str, timeout: float = 300) -> None:
        with self._seen:
            assert self._seen.wait_for(lambda: any(ln.startswith(prefix) for ln in self.lines), timeout)

    def state(self) -> dict[str, Any]:
        self.proc.wait(timeout=300)
        time.sleep(0.1)
        found = [ln for ln in self.lines if ln.startswith("STATE ")]
        assert found, (self.lines[-5:], self.proc.stderr.read() if self.proc.stderr else "")
        return json.loads(found[-1][len("STATE "):])


def _steps(db: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return int(conn.execute("SELECT count(*) FROM steps").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def _wait_steps(db: Path, n: int, attach: subprocess.Popen[str], timeout: float = 120) -> None:
    """Until the run file has ``n`` steps; the attach command's own words if it ended first, or
    when it did not get there in time (stopped by SIGINT, as a user would)."""
    until = time.time() + timeout
    while _steps(db) < n:
        if attach.poll() is not None:
            raise AssertionError(f"attach ended (rc {attach.returncode}) before {n} steps: "
                                 f"{attach.communicate()}")
        if time.time() >= until:
            attach.send_signal(signal.SIGINT)
            try:
                said = attach.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                attach.kill()
                said = attach.communicate()
            raise AssertionError(f"{db}: fewer than {n} steps after {timeout} s "
                                 f"(exists: {db.exists()}); attach said {said}")
        time.sleep(0.1)


def _attach(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "memscope", "attach", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(db: Path, kind: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT message, data FROM events WHERE kind = ?", (kind,)).fetchall()
    finally:
        conn.close()
    return [{"message": m, "data": json.loads(d) if d else None} for m, d in rows]


def _maps_have(pid: int, address: int) -> bool:
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= address < hi:
            return True
    return False


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    _debugger_works()
    tmp = tmp_path_factory.mktemp("attach_pid")
    fast = tmp / "fast"
    out: dict[str, Any] = {"tmp": tmp}
    oom = tmp / "oom"
    target = Target("--steps", str(STEPS), "--leak", "--sleep", "0.01", "--fast-file", str(fast),
                    "--oom-after", str(oom))
    plain = subprocess.run([sys.executable, str(TARGET), "--steps", str(STEPS), "--leak"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    out["plain"] = json.loads(plain.stdout.split("STATE ", 1)[1])
    target.wait_line("at step 50")
    pid = target.proc.pid
    out["pid"] = pid
    try:
        # refusals that need a live torch process, before anything is attached
        empty = tmp / "bin"
        empty.mkdir()
        out["no_debugger"] = memscope("attach", "--pid", str(pid), "--db", str(tmp / "n.db"),
                                      env={"PATH": str(empty)})
        os.kill(pid, signal.SIGSTOP)
        try:
            out["stopped"] = memscope("attach", "--pid", str(pid), "--db", str(tmp / "s.db"))
        finally:
            os.kill(pid, signal.SIGCONT)
        # 1: default options, detached by `memscope detach PID`
        first = _attach("--pid", str(pid), "--headless", "--db", str(tmp / "a.db"))
        _wait_steps(tmp / "a.db", 40, first)
        out["already"] = memscope("attach", "--pid", str(pid), "--db", str(tmp / "x.db"))
        page = _events(tmp / "a.db", "attach_injected")
        out["detach"] = memscope("detach", str(pid))
        out["held"] = {"detach": open_run_files(pid)}  # the moment each way's command returns
        out["first"] = first.communicate(timeout=120)
        out["first_rc"] = first.returncode
        time.sleep(1.0)  # the agent gives its pages back on its next turn; after a detach, none come
        out["page_mapped"] = [_maps_have(pid, e["data"]["page"]) for e in page]
        # 2: the same process again, ended by --max-steps
        second = memscope("attach", "--pid", str(pid), "--headless", "--db", str(tmp / "b.db"),
                          "--max-steps", "15")
        out["second"] = second
        out["held"]["--max-steps"] = open_run_files(pid)
        # 3: ended by ^C to the attach command
        third = _attach("--pid", str(pid), "--headless", "--db", str(tmp / "c.db"))
        _wait_steps(tmp / "c.db", 10, third)
        third.send_signal(signal.SIGINT)
        out["third"] = third.communicate(timeout=120)
        out["third_rc"] = third.returncode
        out["held"]["^C"] = open_run_files(pid)
        fast.touch()
        target.wait_line_prefix("STATE ")
        # 4: attached when it runs out of memory and dies of it
        fourth = _attach("--pid", str(pid), "--headless", "--db", str(tmp / "d.db"))
        until = time.time() + 120
        while not _steps_or_rows(tmp / "d.db"):
            assert time.time() < until and fourth.poll() is None, fourth.stderr.read() if fourth.stderr else ""
            time.sleep(0.1)
        oom.touch()
        out["fourth"] = fourth.communicate(timeout=120)
        out["fourth_rc"] = fourth.returncode
    finally:
        fast.touch()
        oom.touch()
        out["state"] = target.state()
        out["target_rc"] = target.proc.returncode
    return out


def _steps_or_rows(db: Path) -> bool:
    """Whether the agent runs there: its ``attached`` event is written (the command's "attached"
    line comes then too)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return bool(conn.execute("SELECT count(*) FROM events WHERE kind = 'attached'").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return False


def test_leak_from_before_the_attach_is_reported_with_holder_line_and_rate(scenario: dict[str, Any]) -> None:
    assert scenario["first_rc"] == 0, scenario["first"][1]
    report = report_json(scenario["tmp"] / "a.db")
    attached = report["run"]["attached"]
    assert attached["pid"] == scenario["pid"] and attached["steps_before_attach"] is None
    assert attached["process_started"] < attached["attached"] < attached["detached"]
    assert report["run"]["status"] == "finished" and report["leak_check"]["verdict"] == "ok"
    leak = report["leaks"][0]
    assert leak["held_by"] == "__main__.kept"
    line = next(i for i, text in enumerate(TARGET.read_text().splitlines(), 1) if "kept.append(" in text)
    assert leak["site"] == f"tests/scripts/attach_target.py:{line}"
    truth = scenario["state"]["leak_bytes_each"]  # the script's own count: 64 KiB a step
    assert truth == 256 * 64 * 4
    assert abs(leak["bytes_per_step"] - truth) <= 0.05 * truth, leak
    text = memscope("report", str(scenario["tmp"] / "a.db")).stdout
    assert f"attached  pid {scenario['pid']} at " in text
    assert "the training's own step number before it is unknown" in text


def test_training_unchanged_and_nothing_left_after_detach(scenario: dict[str, Any]) -> None:
    state, plain = dict(scenario["state"]), dict(scenario["plain"])
    assert state.pop("memscope_imported") is True and plain.pop("memscope_imported") is False
    assert state == plain  # losses, threads, hooks, patched functions, trace functions, sys.path
    assert scenario["page_mapped"] == [False]  # the debugger's pages were given back


def test_each_way_of_detaching(scenario: dict[str, Any]) -> None:
    tmp = scenario["tmp"]
    reasons = {name: [e["data"]["reason"] for e in _events(tmp / name, "detached")]
               for name in ("a.db", "b.db", "c.db")}
    assert reasons["a.db"][0].startswith("memscope detach (pid ")
    assert reasons["b.db"] == ["15 steps recorded (--max-steps)"]
    assert reasons["c.db"] == ["^C in memscope attach"]
    assert scenario["detach"].returncode == 0 and "detached from pid" in scenario["detach"].stderr
    assert scenario["second"].returncode == 0, scenario["second"].stderr
    assert scenario["third_rc"] == 0, scenario["third"][1]
    # each way's command returns once the target has closed the run file (the agent's last
    # reads of it too), so that an attach right after it is not refused as already recorded
    assert scenario["held"] == {"detach": [], "--max-steps": [], "^C": []}
    assert _steps(tmp / "b.db") == 15
    for name in ("a.db", "b.db", "c.db"):  # step 0 begins at the first boundary after the attach
        conn = sqlite3.connect(tmp / name)
        attached, first_start = conn.execute(
            "SELECT attached, (SELECT min(start) FROM steps) FROM processes").fetchone()
        conn.close()
        anchor = _events(tmp / name, "steps_anchored")[0]["data"]["t"]
        assert attached < anchor == first_start
    for name in ("a.db", "b.db", "c.db"):
        conn = sqlite3.connect(tmp / name)
        assert conn.execute("SELECT status FROM processes").fetchall() == [("detached",)]
        assert conn.execute("SELECT status FROM run").fetchone() == ("finished",)
        conn.close()


def test_refusals_on_a_running_training(scenario: dict[str, Any]) -> None:
    no_dbg = scenario["no_debugger"]
    assert no_dbg.returncode == 2 and no_dbg.stderr.count("\n") == 1, no_dbg.stderr
    assert "gdb or lldb is needed" in no_dbg.stderr and "apt-get install" in no_dbg.stderr
    stopped = scenario["stopped"]
    assert stopped.returncode == 2 and stopped.stderr.count("\n") == 1
    assert f"pid {scenario['pid']} is stopped" in stopped.stderr and "kill -CONT" in stopped.stderr
    already = scenario["already"]
    assert already.returncode == 2 and already.stderr.count("\n") == 1, already.stderr
    assert "already recorded by memscope into " in already.stderr and "a.db" in already.stderr
    for name in ("n.db", "s.db", "x.db"):
        assert not (scenario["tmp"] / name).exists()


def test_an_oom_while_attached_is_captured(scenario: dict[str, Any]) -> None:
    """Attached after the training's end, when its next forward runs out of host memory and the
    process dies of it: the post-mortem is in the run file, the process's end too."""
    assert scenario["target_rc"] == 1  # the uncaught out-of-memory error
    assert scenario["fourth_rc"] == 0, scenario["fourth"][1]
    assert f"pid {scenario['pid']} ended while attached" in scenario["fourth"][1]
    report = report_json(scenario["tmp"] / "d.db")
    oom = report["oom"]
    assert oom is not None and oom["requested_bytes"] >= (1 << 42) * 64 * 4, oom
    assert "DefaultCPUAllocator" in oom["message"]
    assert report["run"]["attached"]["ended_how"] == "the process ended while memscope was attached"

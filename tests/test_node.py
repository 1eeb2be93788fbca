"""``memscope top`` and ``memscope daemon`` on real processes of this host.

One set of processes (tests/scripts/node_proc.py, started with plain python) serves every test
here: three with torch loaded - one leaking 64 KiB a step at 20 steps a second, one training
without leaking, one idle (run as uid nobody through setpriv when the suite is root) - and one
Python process without torch. Other torch processes of parallel tests may be on the host too:
the tests look at their own pids (and the daemon that attaches watches only processes with this
module's tag in their command line).

The fixture, in this order, overlapping what can overlap:
1. ``memscope top --once --json --window 10`` (root), and beside it for the same 10 s a
   ``memscope daemon --prometheus 127.0.0.1:0`` on the same set (scraped at the end of the
   window), a non-root top (uid 65533: nobody's process is another user's to it), and the
   commands that must refuse with one line;
2. the daemon stopped (SIGTERM), then started again on the same node file with
   ``--auto-attach`` (it continues the file) until its attach to the leak is done;
3. the processes stay up for the Pilot tests of the live view (which attach and detach the
   healthy one through Enter and d).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, SCRIPTS, cli, report_json
from memscope.node.nodereader import NodeReader

PROC = SCRIPTS / "node_proc.py"
WINDOW = 10
NOBODY, OTHER = 65534, 65533  # nobody runs the idle process; 65533 (no name) runs a non-root top
pytestmark = pytest.mark.slow


def _as_root() -> bool:
    return os.geteuid() == 0


class Proc:
    """A process of the set, its stdout read line by line."""

    def __init__(self, mode: str, tag: str, user: int | None = None, *extra: str) -> None:
        cmd = [sys.executable, str(PROC), "--mode", mode, "--tag", tag, "--seconds", "400", *extra]
        if user is not None:
            setpriv = shutil.which("setpriv")
            assert setpriv, "setpriv (util-linux) is needed for the second-user tests"
            cmd = [setpriv, f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
        self.mode = mode
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self.pid = self.popen.pid  # setpriv execs: the same pid
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if line.strip() == "ready":
                self.ready.set()

    def wait_ready(self, timeout: float = 120) -> None:
        if not self.ready.wait(timeout):
            self.popen.kill()
            raise AssertionError(f"{self.mode}: not ready: {self.popen.stderr.read() if self.popen.stderr else ''}")

    def stop(self) -> None:
        self.popen.kill()
        self.popen.wait()


class Daemon:
    def __init__(self, *args: str) -> None:
        self.popen = subprocess.Popen([sys.executable, "-m", "memscope", "daemon", *args], cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._seen = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                self._seen.notify_all()

    def wait_line(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        with self._seen:
            found: list[re.Match[str]] = []

            def seen() -> bool:
                found[:] = [m for m in (re.search(pattern, ln) for ln in self.lines) if m]
                return bool(found) or self.popen.poll() is not None

            self._seen.wait_for(seen, timeout)
        assert found, (pattern, self.lines)
        return found[0]

    def stop(self) -> int:
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=120)


def _events(db: Path, kind: str) -> list[dict[str, Any]]:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2)
        try:
            rows = conn.execute("SELECT t, message, data FROM events WHERE kind = ?", (kind,)).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []
    return [{"t": t, "message": m, "data": json.loads(d) if d else None} for t, m, d in rows]


def _scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def _refusals(tmp: Path, node_db: Path) -> dict[str, subprocess.Popen[str]]:
    """Commands that must say one line and exit 2, started at once (they run while top samples)."""
    (tmp / "not-a-node.db").write_text("someone's notes\n")

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "memscope", *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    return {"foreign": start("daemon", "--db", str(tmp / "not-a-node.db")),
            "address": start("daemon", "--db", str(tmp / "x.db"), "--prometheus", "localhost:http"),
            "steps": start("daemon", "--db", str(tmp / "y.db"), "--attach-steps", "5"),
            "json": start("top", "--json"),
            "tty": start("top"),
            "twice": start("daemon", "--db", str(node_db)),
            "text": start("top", "--once", "--window", "1")}


@pytest.fixture(scope="module")
def node_set(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("node")
    os.chmod(tmp, 0o755)  # the non-root top runs there
    tag = f"nodetest-{os.getpid()}-{tmp.name}"
    out: dict[str, Any] = {"tmp": tmp, "tag": tag, "db": tmp / "node.db"}
    # the healthy one holds a named pipe open with no writer: whoever opened it to read its header
    # would wait forever (only regular files are looked into)
    procs = {"leak": Proc("leak", tag), "healthy": Proc("healthy", tag, None, "--fifo", str(tmp / "fifo")),
             "idle": Proc("idle", tag, user=NOBODY if _as_root() else None), "plain": Proc("plain", tag),
             "mapper": Proc("mapper", tag)}
    out["procs"] = procs
    started: list[subprocess.Popen[str]] = []  # every command the fixture runs: none outlives it
    try:
        for p in procs.values():
            p.wait_ready()
        out["pids"] = {name: p.pid for name, p in procs.items()}
        # 1. top --once, the daemon beside it, a non-root top, the refusals
        top = subprocess.Popen([sys.executable, "-m", "memscope", "top", "--once", "--json", "--window", str(WINDOW)],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        daemon = Daemon("--db", str(out["db"]), "--interval", "0.25", "--window", str(WINDOW),
                        "--prometheus", "127.0.0.1:0")
        started += [top, daemon.popen]
        other = other_daemon = None
        if _as_root():  # another user: a top, and a daemon that would attach to what grows
            shared = Path("/tmp") / f"memscope-node-{OTHER}-{os.getpid()}"  # pytest's base is root's alone
            shared.mkdir(mode=0o777)
            shared.chmod(0o777)
            out["shared"] = shared
            as_other = [shutil.which("setpriv") or "setpriv", f"--reuid={OTHER}", f"--regid={OTHER}",
                        "--clear-groups", sys.executable, "-m", "memscope"]
            env = {**os.environ, "HOME": str(shared)}
            other = subprocess.Popen([*as_other, "top", "--once", "--json", "--window", "1"], cwd=shared, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # the daemon with CAP_SYS_PTRACE (as a DaemonSet's container may have): it reads every
            # process's memory map, and still touches no other user's
            capable = [as_other[0], "--inh-caps=+sys_ptrace", "--ambient-caps=+sys_ptrace", *as_other[1:]]
            other_daemon = subprocess.Popen([*capable, "daemon", "--db", str(shared / "other.db"), "--interval",
                                             "0.2", "--window", "4", "--auto-attach", "--match", re.escape(tag)],
                                            cwd=shared, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True)
            started += [other, other_daemon]
        out["address"] = daemon.wait_line(r"Prometheus metrics on http://(\S+)/metrics").group(1)
        daemon.wait_line(r"watching the torch processes")
        refusals = _refusals(tmp, out["db"])
        started += refusals.values()
        out["refusals"] = {name: (p.wait(timeout=60), *p.communicate()) for name, p in refusals.items()}
        if other is not None:
            out["other"] = (other.wait(timeout=60), *other.communicate())
        top_out, top_err = top.communicate(timeout=120)
        assert top.returncode == 0, top_err
        if other_daemon is not None:  # it ran the whole window too
            other_daemon.send_signal(signal.SIGTERM)
            out["other_daemon"] = (other_daemon.wait(timeout=60), *other_daemon.communicate())
        out["top"] = json.loads(top_out)
        out["metrics"] = _scrape(out["address"])
        out["daemon1"] = (daemon.stop(), daemon.lines)
        # 2. again on the same node file, attaching to what grows (this module's processes only); the
        # Pilot tests run meanwhile, the tests of its result wait for it (daemon_two)
        out["again"] = Daemon("--db", str(out["db"]), "--interval", "0.25", "--window", str(WINDOW),
                              "--auto-attach", "--attach-steps", "40", "--attach-dir", str(tmp),
                              "--match", re.escape(tag))
        yield out
    finally:
        again = out.get("again")
        if again is not None and again.popen.poll() is None:
            again.stop()
        for popen in started:
            if popen.poll() is None:
                popen.kill()
                popen.wait()
        for p in procs.values():
            p.stop()
        if "shared" in out:
            shutil.rmtree(out["shared"], ignore_errors=True)


@pytest.fixture(scope="module")
def daemon_two(node_set: dict[str, Any]) -> tuple[int, list[str]]:
    """The auto-attaching daemon's exit status and lines, once its attach to the leak is done."""
    again = node_set["again"]
    until = time.monotonic() + 120
    while not _events(node_set["db"], "attach_done"):
        assert time.monotonic() < until and again.popen.poll() is None, again.lines
        time.sleep(0.2)
    return again.stop(), again.lines


def _mine(doc: dict[str, Any], pids: dict[str, int]) -> dict[str, dict[str, Any]]:
    by_pid = {p["pid"]: p for p in doc["processes"]}
    return {name: by_pid[pid] for name, pid in pids.items() if pid in by_pid}


# -- the live view (Textual Pilot) ----------------------------------------------------------------

async def _until(pilot: Any, check: Any, timeout: float, what: str) -> None:
    until = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < until, what
        await pilot.pause(0.05)


async def test_top_view_rows_and_sorting(node_set: dict[str, Any]) -> None:
    from textual.widgets import DataTable

    from memscope.units import human_bytes
    from memscope_tui.top import LiveSource, TopApp

    pids = node_set["pids"]
    app = TopApp(LiveSource(WINDOW), interval=0.25)
    async with app.run_test(size=(160, 40)) as pilot:
        mine = {str(pids[n]) for n in ("leak", "healthy", "idle")}
        # (the leak's verdict is top --once's test: the daemon beside this one may be attaching to it)
        await _until(pilot, lambda: mine <= set(app.rows) and app.samples >= 4, 30, "the set in the live view")
        table = app.query_one("#top-table", DataTable)
        assert str(pids["plain"]) not in app.rows and str(pids["mapper"]) not in app.rows

        def order() -> list[str]:
            return [str(table.coordinate_to_cell_key((i, 0)).row_key.value) for i in range(table.row_count)]

        def cell(pid: int, column: str) -> str:
            return str(table.get_cell(str(pid), column))

        rows = app.rows
        by_growth = sorted(rows, key=lambda k: (-rows[k].growth_bytes_per_s, rows[k].pid))
        assert order() == by_growth and str(table.columns["growth"].label) == "GROWTH ▼"
        assert cell(pids["idle"], "growth") == "0" and cell(pids["idle"], "recorded") == "-"
        assert cell(pids["leak"], "rss") == human_bytes(rows[str(pids["leak"])].host_rss_bytes)
        for key in mine:  # a leak suspect's growth is drawn bold red
            growth = table.get_cell(key, "growth")
            assert ("bold red" in str(growth.style)) == rows[key].growing, (key, growth)
        assert "--mode leak" in cell(pids["leak"], "command") and node_set["tag"] in cell(pids["leak"], "command")
        await pilot.press("s")
        rows = app.rows
        assert order() == sorted(rows, key=lambda k: (-rows[k].host_rss_bytes, rows[k].pid))
        assert str(table.columns["rss"].label) == "RSS ▼"
        await pilot.click("#top-table", offset=(3, 0))  # the PID heading
        await pilot.pause()
        assert order() == sorted(app.rows, key=int) and str(table.columns["pid"].label) == "PID ▼"
        caption = str(app.query_one("#top-caption").render())
        assert "torch processes on " in caption and f"growth over {WINDOW} s" in caption
        if not os.path.exists("/dev/nvidiactl"):
            assert "GPU: no NVIDIA driver on this machine" in caption and cell(pids["leak"], "gpu") == "-"


async def test_top_view_enter_attaches_and_d_detaches(node_set: dict[str, Any]) -> None:
    """Enter on the healthy process: memscope attach --pid records it and the view opens its
    dashboard (here, under Pilot, there is no terminal to hand over: it says the command); d runs
    memscope detach and the run file ends detached; the training goes on."""
    from textual.widgets import DataTable

    from memscope_tui.top import TopApp, LiveSource

    pid = node_set["pids"]["healthy"]
    app = TopApp(LiveSource(WINDOW), interval=0.25, attach_dir=str(node_set["tmp"]))
    async with app.run_test(size=(160, 40)) as pilot:
        await _until(pilot, lambda: str(pid) in app.rows, 30, "the healthy process in the view")
        table = app.query_one("#top-table", DataTable)
        table.move_cursor(row=table.get_row_index(str(pid)))
        await pilot.press("enter")
        await _until(pilot, lambda: app.dashboards or any("error" in s for s in app.said), 120,
                     f"an attach to pid {pid}: {app.said}")
        assert app.dashboards, app.said
        run_file = app.dashboards[0]
        assert app.said[-1] == f"cannot open the dashboard here (SuspendNotSupported): memscope tui {run_file}"
        assert f"recording pid {pid} into {run_file}" in app.said
        await _until(pilot, lambda: app.rows.get(str(pid)) is not None and app.rows[str(pid)].run_file == run_file
                     and app.rows[str(pid)].recorded is not None, 10, "the row recorded")
        recorded = str(table.get_cell(str(pid), "recorded"))  # its run file's own verdict (or none yet)
        assert app.rows[str(pid)].recorded.words[:16] in recorded, recorded
        table.move_cursor(row=table.get_row_index(str(pid)))
        await pilot.press("d")
        await _until(pilot, lambda: any("detached from pid" in s for s in app.said), 90, f"a detach: {app.said}")
        assert f"detached from pid {pid}; its record: {run_file}" in app.said
    conn = sqlite3.connect(run_file)
    try:
        assert conn.execute("SELECT status FROM processes WHERE pid = ?", (pid,)).fetchone() == ("detached",)
        reason = conn.execute("SELECT data FROM events WHERE kind = 'detached'").fetchone()[0]
    finally:
        conn.close()
    assert json.loads(reason)["reason"].startswith("memscope detach (pid ")
    assert node_set["procs"]["healthy"].popen.poll() is None
    assert Path(run_file).parent == node_set["tmp"]


# -- memscope top --once --json ------------------------------------------------------------------

def test_top_once_lists_the_torch_processes_and_only_the_leak_grows(node_set: dict[str, Any]) -> None:
    doc, pids = node_set["top"], node_set["pids"]
    assert doc["schema"] == "memscope.top/1"
    mine = _mine(doc, pids)
    # absent: the Python process without torch, and the one that maps libtorch's file without running
    # it (what a debugger reading its symbols does)
    assert sorted(mine) == ["healthy", "idle", "leak"]
    assert {name for name, p in mine.items() if p["growing"]} == {"leak"}
    for name, p in mine.items():
        assert set(p) >= {"pid", "user", "command", "host_rss_bytes", "gpu_bytes", "growth_bytes_per_s",
                          "growing", "run_file"}
        assert p["run_file"] is None and p["host_rss_bytes"] > 50 << 20
        assert f"--mode {name}" in p["command"] and node_set["tag"] in p["command"]
        assert p["samples"] >= 16
    leak = mine["leak"]
    # 64 KiB a step at 20 steps a second: 1.25 MiB/s of tensors; the heap pages around them add some
    assert 0.6 * (1.25 * 2**20) < leak["growth_bytes_per_s"] < 4 * (1.25 * 2**20), leak
    assert leak["growing_on"] == "host_rss" and leak["growing_since"] is not None
    assert mine["healthy"]["growth_bytes_per_s"] < 64 << 10 and mine["idle"]["growth_bytes_per_s"] < 64 << 10
    if not os.path.exists("/dev/nvidiactl"):  # CPU only: host figures, and why the GPU columns are empty
        assert doc["gpu"] == {"available": False, "why": "no NVIDIA driver on this machine: host figures only"}
        assert all(p["gpu_bytes"] is None for p in mine.values())
    else:
        assert all(p["gpu_bytes"] == 0 for p in mine.values())  # CPU trainings hold no device memory


def test_another_users_process(node_set: dict[str, Any]) -> None:
    """nobody's idle torch process: root lists it as nobody's; a top running as another non-root
    user (uid 65533) cannot read its memory map and says so, listing none of the set; a daemon as
    that user, with CAP_SYS_PTRACE, reads them all and attaches to none (the leak: skipped, why)."""
    if not _as_root():
        pytest.skip("needs root to run a second user (setpriv); the suite runs as root in CI")
    pids = node_set["pids"]
    assert _mine(node_set["top"], pids)["idle"]["user"] == "nobody"
    rc, stdout, stderr = node_set["other"]
    assert rc == 0, stderr
    doc = json.loads(stdout)
    assert doc["as_root"] is False and not _mine(doc, pids)
    unreadable = {u["pid"]: u for u in doc["unreadable"]}
    idle = unreadable[pids["idle"]]
    assert idle["user"] == "nobody" and "--mode idle" in idle["command"]
    assert idle["why"] == ("cannot read its memory map: a process of nobody, and memscope runs as 65533 "
                           "(root sees whether it has torch)")
    assert pids["leak"] in unreadable  # root's, to 65533: another user's too
    assert pids["plain"] in unreadable  # it looks like Python: whether it has torch cannot be told
    # a daemon run by that user with CAP_SYS_PTRACE sees them all, flags the leak, touches nothing
    rc, _out, err = node_set["other_daemon"]
    assert rc == 0, err
    assert "; not root: other users' processes are not touched" in err
    with NodeReader(node_set["shared"] / "other.db") as reader:
        assert {p["pid"] for p in reader.processes()} == {pids[n] for n in ("leak", "healthy", "idle")}
        assert not reader.events("attach_started")
        skipped = reader.events("attach_skipped")
    assert [e["data"]["pid"] for e in skipped] == [pids["leak"]], err
    assert skipped[0]["data"]["why"] == ("it belongs to user root and memscope runs as 65533: not touched (run "
                                         "the daemon as root to attach to every user's processes)")
    assert f"memscope: not attaching to pid {pids['leak']}: it belongs to user root" in err


def test_refusals_are_one_line(node_set: dict[str, Any]) -> None:
    said = {name: (rc, err) for name, (rc, _out, err) in node_set["refusals"].items()}
    expected = {
        "foreign": "not-a-node.db: exists and is not a memscope node file; refusing to write into it",
        "address": "daemon: --prometheus 'localhost:http': give PORT or HOST:PORT",
        "steps": "daemon: --attach-steps and --attach-dir go with --auto-attach",
        "json": "top: --json goes with --once",
        "tty": "top: the live view needs a terminal; use --once (and --json) in scripts",
        "twice": "node.db: another memscope daemon writes it (pid ",
    }
    rc, out, err = node_set["refusals"]["text"]  # (not a refusal: top --once as text, run beside them)
    assert rc == 0, err
    lines = out.splitlines()
    assert re.match(r"\d+ torch process(es)? on \S+; growth over 1 s", lines[0]) and "PID" in lines[1]
    leak = next(ln for ln in lines if ln.split()[:1] == [str(node_set["pids"]["leak"])])
    assert "--mode leak" in leak and not any(ln.split()[:1] == [str(node_set["pids"]["plain"])] for ln in lines)
    for name, needle in expected.items():
        rc, err = said[name]
        assert rc == 2 and err.count("\n") == 1 and err.startswith("memscope: error: ") and needle in err, (name, err)
    assert (node_set["tmp"] / "not-a-node.db").read_text() == "someone's notes\n"
    assert not (node_set["tmp"] / "x.db").exists() and not (node_set["tmp"] / "y.db").exists()


# -- memscope daemon ---------------------------------------------------------------------------

def test_node_file_is_made_safely_and_continued(node_set: dict[str, Any], daemon_two: Any) -> None:
    from memscope.node.nodefile import is_node_file
    from memscope.store.runs import is_run_file

    db = node_set["db"]
    st = os.stat(db)
    assert stat.S_IMODE(st.st_mode) == 0o600 and is_node_file(str(db)) and not is_run_file(str(db))
    assert node_set["daemon1"][0] == 0 and daemon_two[0] == 0
    starts = _events(db, "daemon_started")
    assert len(starts) == 2 and "continuing this node file" in starts[1]["message"]
    assert len(_events(db, "daemon_stopped")) == 2
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT status FROM node").fetchone() == ("finished",)
        rows = {pid: (n, ended) for pid, n, ended in conn.execute(
            "SELECT p.pid, count(s.t), p.ended FROM processes p JOIN samples s ON s.proc = p.id GROUP BY p.id")}
    finally:
        conn.close()
    pids = node_set["pids"]
    assert pids["plain"] not in rows and pids["mapper"] not in rows
    for name in ("leak", "healthy", "idle"):
        assert rows[pids[name]][0] >= 2 * 16, name  # both daemons' samples, on one process row each


def test_node_report(node_set: dict[str, Any], daemon_two: Any) -> None:
    db, pids = node_set["db"], node_set["pids"]
    out = cli("report", str(db), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["schema"] == "memscope.node/1" and doc["node"]["status"] == "finished"
    mine = _mine(doc, pids)
    assert sorted(mine) == ["healthy", "idle", "leak"]
    assert [s["pid"] for s in doc["suspects"] if s["pid"] in pids.values()][:1] == [pids["leak"]]
    assert not mine["healthy"]["suspects"] and not mine["idle"]["suspects"]
    assert mine["leak"]["peak_host_rss_bytes"] >= mine["leak"]["host_rss_bytes"] > 0
    flagged = mine["leak"]["suspects"][0]
    assert flagged["metric"] == "host_rss" and flagged["bytes_per_s"] > 256 << 10
    assert flagged["since"] <= flagged["flagged"]
    attach = mine["leak"]["attaches"][0]
    line = next(i for i, t in enumerate(PROC.read_text().splitlines(), 1) if "kept.append(torch.randn" in t)
    assert attach["exit_code"] == 0 and attach["leak_verdict"] == "leak", attach
    assert attach["held_by"] == "__main__.kept" and attach["site"].endswith(f"tests/scripts/node_proc.py:{line}")
    assert abs(attach["bytes_per_step"] - 64 * 1024) <= 0.05 * 64 * 1024
    assert not any(a["pid"] != pids["leak"] for a in doc["attaches"])  # only its own tagged processes
    text = cli("report", str(db)).stdout
    assert f"pid {pids['leak']}: host RSS +" in text and "leak suspects" in text
    assert "leak +64.00 KiB/step held by __main__.kept, stored at " in text
    html = cli("report", str(db), "--html", str(node_set["tmp"] / "n.html"))
    assert html.returncode == 2 and "--html is for run files" in html.stderr


def test_auto_attach_leaves_a_run_file_with_the_leaks_holder(node_set: dict[str, Any], daemon_two: Any) -> None:
    done = _events(node_set["db"], "attach_done")[0]["data"]
    run_file = Path(done["run_file"])
    assert run_file.parent == node_set["tmp"]
    report = report_json(run_file)
    assert report["run"]["attached"]["pid"] == node_set["pids"]["leak"]
    assert report["run"]["status"] == "finished"
    leak = report["leaks"][0]
    assert leak["held_by"] == "__main__.kept" and leak["site"].endswith("tests/scripts/node_proc.py:"
                                                                            f"{done['site'].rsplit(':', 1)[1]}")
    lines = daemon_two[1]
    assert any(f"leak suspect: pid {node_set['pids']['leak']} " in ln for ln in lines), lines
    assert any(f"pid {node_set['pids']['leak']}: leak +64.00 KiB/step held by __main__.kept" in ln for ln in lines)
    assert node_set["procs"]["leak"].popen.poll() is None  # detached: the training goes on
    # the debugger stopping the process while it injects is not the end of the leak
    started = _events(node_set["db"], "attach_started")[0]["t"]
    ended = _events(node_set["db"], "attach_done")[0]["t"]
    assert not [e for e in _events(node_set["db"], "suspect_cleared")
                if started <= e["t"] <= ended and e["data"]["pid"] == node_set["pids"]["leak"]]


def test_prometheus_metrics(node_set: dict[str, Any]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    assert node_set["address"].startswith("127.0.0.1:")  # bound to loopback: given so here
    families = {f.name: f for f in text_string_to_metric_families(node_set["metrics"])}
    pids = {str(v): k for k, v in node_set["pids"].items()}

    def values(name: str) -> dict[str, float]:
        return {pids[s.labels["pid"]]: s.value for s in families[name].samples if s.labels["pid"] in pids}

    assert all(name.startswith("memscope_") for name in families)
    rss = values("memscope_process_host_rss_bytes")
    assert sorted(rss) == ["healthy", "idle", "leak"] and all(v > 50 << 20 for v in rss.values())
    sample = next(s for s in families["memscope_process_host_rss_bytes"].samples
                  if s.labels["pid"] == str(node_set["pids"]["leak"]))
    assert "--mode leak" in sample.labels["command"] and node_set["tag"] in sample.labels["command"]
    assert sample.labels["user"] == _mine(node_set["top"], node_set["pids"])["leak"]["user"]
    assert values("memscope_process_leak_suspect") == {"leak": 1.0, "healthy": 0.0, "idle": 0.0}
    growth = {pids[s.labels["pid"]]: s.value for s in families["memscope_process_growth_bytes_per_second"].samples
              if s.labels["pid"] in pids and s.labels["memory"] == "host_rss"}
    assert growth["leak"] > 256 << 10 and growth["healthy"] < 64 << 10
    assert values("memscope_process_recorded") == {"leak": 0.0, "healthy": 0.0, "idle": 0.0}


def test_prometheus_client_is_imported_only_with_prometheus() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys, memscope.cli.daemon, memscope.node.daemon, "
                          "memscope.cli.top; print('prometheus_client' in sys.modules)"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


async def test_tui_on_a_node_file_shows_the_daemons_last_sample(node_set: dict[str, Any], daemon_two: Any) -> None:
    """``memscope tui NODE.db`` opens the top view on what the daemon saw (the rows of its last
    sample, their growth over its window from the stored samples), not on the host."""
    from textual.widgets import DataTable

    from memscope_tui.top import FileSource, TopApp

    pids = node_set["pids"]
    app = TopApp(FileSource(str(node_set["db"])), interval=5)
    async with app.run_test(size=(160, 40)) as pilot:
        await _until(pilot, lambda: app.samples >= 1, 30, "the node file read")
        assert set(app.rows) == {str(pids[n]) for n in ("leak", "healthy", "idle")}  # --match: its own only
        table = app.query_one("#top-table", DataTable)
        assert "--mode healthy" in str(table.get_cell(str(pids["healthy"]), "command"))
        caption = str(app.query_one("#top-caption").render())
        assert "the daemon's last sample, " in caption and f"growth over {WINDOW} s" in caption
        assert not app.source.live

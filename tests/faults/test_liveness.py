"""Telling an abandoned run from a live one: pids on the host that wrote it, heartbeats elsewhere."""

from __future__ import annotations

import os
import socket
import subprocess
import time

from memscope.store.liveness import STALE_S, is_abandoned, pid_alive


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def run(**kw: object) -> dict[str, object]:
    return {"status": "running", "host": socket.gethostname(), "started": time.time(), **kw}


def test_pids_decide_on_the_host_that_wrote_it() -> None:
    me = os.getpid()
    assert not is_abandoned(run(owner_pid=me), [], lambda: None)
    assert is_abandoned(run(owner_pid=dead_pid()), [], lambda: None)
    # the owner is gone but a training process still runs: live
    procs = [{"pid": me, "status": "running", "host": None}]
    assert not is_abandoned(run(owner_pid=dead_pid()), procs, lambda: None)
    # a process that ended (status stopped) does not count as a writer
    procs = [{"pid": me, "status": "stopped", "host": None}]
    assert is_abandoned(run(owner_pid=dead_pid()), procs, lambda: None)


def test_a_reused_pid_is_not_the_writer() -> None:
    # this process exists, but it started long after a run that began a day ago
    old = run(owner_pid=os.getpid(), started=time.time() - 86400)
    assert pid_alive(os.getpid(), time.time() - 86400) is False
    assert is_abandoned(old, [], lambda: time.time() - 86400)


def test_heartbeat_decides_elsewhere() -> None:
    now = time.time()
    far = run(host="another-host", started=now - 3600, owner_pid=1)
    assert not is_abandoned(far, [], lambda: now - 5, now=now)
    assert is_abandoned(far, [], lambda: now - STALE_S - 1, now=now)
    assert not is_abandoned(run(host="another-host", started=now - 10), [], lambda: None, now=now)


def test_only_running_runs_can_be_abandoned() -> None:
    assert not is_abandoned(run(status="finished", owner_pid=dead_pid()), [], lambda: None)

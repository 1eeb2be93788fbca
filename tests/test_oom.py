"""Out-of-memory post-mortems: real CPU allocator failures under attach, kills, snapshot import."""

from __future__ import annotations

import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, SCRIPTS, cli, memscope, report_json
from shared_runs import shared_attach
from test_oom_at_failure import CATCH_OPTIONS, saved_model_run

REQUEST = 3377699720527872


def attach(db: Path, *command: str, **kw: object) -> "subprocess.CompletedProcess[str]":
    return memscope("attach", "--headless", "--db", str(db), *command, **kw)  # type: ignore[arg-type]


def test_forward_oom_example(tmp_path_factory: pytest.TempPathFactory) -> None:
    script = str(EXAMPLES / "oom.py")
    plain = subprocess.run([sys.executable, script, "--fail-step", "3"], capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    # the session's run of examples/oom.py (conftest's oom_example_run: the exports' and the
    # dashboard's tests read it too), made once (tests/shared_runs.py)
    run_db, out = shared_attach(tmp_path_factory, ["--sample-hz", "50"], ["examples/oom.py", "--fail-step", "3"])
    assert out.returncode == plain.returncode == 1, out.stderr
    assert "can't allocate memory" in out.stderr  # the script's own traceback, unchanged
    report = report_json(run_db)
    assert report["oom"] is not None
    # "rank": added by the multi-rank work (analysis/oom.py); None for a single process;
    # "breakdown", "breakdown_step": what was live at the failure, and where it was measured;
    # "limit": the memory limit it ran into (issue 23)
    assert set(report["oom"]) == {"step", "phase", "module", "requested_bytes", "live_bytes", "message",
                                  "rank", "breakdown", "breakdown_step", "limit"}
    assert report["oom"]["rank"] is None
    oom = report["oom"]
    assert oom["step"] == 3 and oom["phase"] == "forward" and oom["module"] == "expand"
    assert oom["requested_bytes"] == REQUEST
    assert oom["live_bytes"] > 0 and "can't allocate memory" in oom["message"]
    assert report["run"]["steps"] == 3 and report["run"]["exit_code"] == 1
    with sqlite3.connect(run_db) as conn:
        assert conn.execute("SELECT step FROM steps WHERE status = 'failed'").fetchall() == [(3,)]
        assert conn.execute("SELECT count(*) FROM events WHERE kind = 'oom'").fetchone()[0] == 1
    text = cli("oom", str(run_db))
    assert text.returncode == 0, text.stderr
    assert "step 3, forward, in module expand (Expand)" in text.stdout
    assert "requested 3072.00 TiB" in text.stdout and "host RSS" in text.stdout
    assert "a shape bug: the request is larger than any device" in text.stdout
    summary = cli("report", str(run_db))
    assert "out of memory at step 3 (forward, expand)" in summary.stdout


BACKWARD = '''
import argparse, torch, torch.nn as nn
p = argparse.ArgumentParser(); p.add_argument("--catch", action="store_true"); a = p.parse_args()
class Greedy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        torch.empty(2 ** 50)  # 4 PiB of float32: a real CPU allocator failure in backward
        return g * 2
model = nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    loss = model(torch.randn(4, 8))
    if step == 2:
        loss = Greedy.apply(loss)
    try:
        loss.sum().backward()
    except RuntimeError:
        if not a.catch:
            raise
        opt.zero_grad()
        continue
    opt.step(); opt.zero_grad()
'''


def test_backward_oom(tmp_path: Path) -> None:
    script = tmp_path / "bw.py"
    script.write_text(BACKWARD)
    db = tmp_path / "bw.db"
    out = attach(db, str(script))
    assert out.returncode == 1, out.stderr
    oom = report_json(db)["oom"]
    assert oom["step"] == 2 and oom["phase"] == "backward"
    assert oom["module"] is None  # backward runs in autograd's engine: no module frame
    assert oom["requested_bytes"] == 2 ** 52
    # caught by the script: still recorded once, and the run goes on
    db2 = tmp_path / "bw2.db"
    out = attach(db2, str(script), "--catch")
    assert out.returncode == 0, out.stderr
    report = report_json(db2)
    assert report["oom"]["phase"] == "backward" and report["run"]["exit_code"] == 0
    with sqlite3.connect(db2) as conn:
        assert conn.execute("SELECT count(*) FROM events WHERE kind = 'oom'").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM steps WHERE status = 'failed'").fetchone()[0] == 0




def test_caught_forward_oom_batch_size_finder(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    out = attach(db, "--layers-every", "1", "--layers-first", "0", "--catch-forward-oom",
                 str(SCRIPTS / "batch_finder.py"), "64", "0")
    assert out.returncode == 0, out.stderr
    assert "batch 16" in out.stdout
    report = report_json(db)
    assert report["run"]["exit_code"] == 0 and report["run"]["steps"] == 6
    # both OOMs happen in step 0, before any profiled step: the hooks armed for step 0 see them
    # (issue #14; tests/test_oom_at_failure.py checks the same at default options)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM steps WHERE status = 'failed'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM events WHERE kind = 'oom' AND step = 0").fetchone()[0] == 2
    # every caught OOM: report --json's ooms (the first is oom, in full; the second summarised),
    # memscope oom's "later" line
    first, second = report["ooms"]
    assert first == report["oom"] and (second["step"], second["phase"], second["module"]) == (0, "forward", "1")
    assert second["requested_bytes"] == 2 ** 52 and set(second) == {
        "step", "phase", "module", "requested_bytes", "live_bytes", "message"}
    text = cli("oom", str(db)).stdout
    assert "\nlater     step 0, forward, in module 1: requested 4096.00 TiB with " in text


def test_caught_forward_oom_after_root_known(tmp_path: Path) -> None:
    db = tmp_path / "f2.db"
    out = attach(db, "--layers-every", "1", "--layers-first", "0", "--catch-forward-oom",
                 str(SCRIPTS / "batch_finder.py"), "8", "3")
    assert out.returncode == 0, out.stderr
    report = report_json(db)
    assert report["run"]["exit_code"] == 0 and report["run"]["steps"] == 6
    oom = report["oom"]
    assert oom is not None and oom["step"] == 3 and oom["phase"] == "forward" and oom["module"] == "1"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM events WHERE kind = 'oom'").fetchone()[0] == 2  # 64, 32
        assert conn.execute("SELECT count(*) FROM steps WHERE status = 'failed'").fetchone()[0] == 0
        assert [r[0] for r in conn.execute("SELECT step FROM steps ORDER BY step")] == list(range(6))


def test_no_oom(tmp_path_factory: pytest.TempPathFactory) -> None:
    # a healthy run: the dashboard tests' 8-step tiny_gpt, made once per session (tests/shared_runs.py)
    run_db, out = shared_attach(tmp_path_factory, [], ["examples/tiny_gpt.py", "--steps", "8"])
    assert out.returncode == 0, out.stderr
    assert report_json(run_db)["oom"] is None
    text = cli("oom", str(run_db))
    assert text.returncode == 0 and text.stdout.strip() == "no out-of-memory in this run"


def test_sigkill_from_outside(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db),
                             str(SCRIPTS / "loop.py"), "--steps", "1000", "--sleep", "0.05"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = None
        deadline = time.time() + 60
        while time.time() < deadline and pid is None:
            time.sleep(0.2)
            try:  # read-only: a read-write connect would create the file before attach does
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                    row = conn.execute("SELECT pid FROM processes").fetchone()
                    steps = conn.execute("SELECT count(*) FROM steps").fetchone()[0]
                if row and steps >= 2:
                    pid = row[0]
            except sqlite3.Error:
                pass
        assert pid is not None, "the child never recorded two steps"
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + 9, err
    report = report_json(db)
    assert report["run"]["signal"] == 9
    assert report["oom"] is None  # a small process: not the OOM killer's doing
    text = cli("oom", str(db))
    assert text.returncode == 0
    assert "killed by signal 9 (SIGKILL)" in text.stdout
    assert "probably not the OOM killer" in text.stdout and "host RSS" in text.stdout


def test_oom_killer_hint(tmp_path: Path) -> None:
    """The hint needs the last RSS above 80% of the machine: checked with a tiny 'machine'."""
    from memscope.store.runs import create_run
    from memscope.store.writer import connect_rw
    from memscope.runners.supervisor import record_killed

    db = str(tmp_path / "h.db")
    create_run(db, ["python", "x.py"])
    conn = connect_rw(db)
    with conn:
        conn.execute("INSERT INTO samples (proc, t, step, rss) VALUES (1, 1.0, 7, 900)")
    conn.close()
    record_killed(db, 9, host_total=1000)
    out = cli("oom", db)
    assert "killed by signal 9 (possibly the kernel's OOM killer)" in out.stdout
    assert "step 7" in out.stdout
    assert report_json(db)["oom"]["message"].startswith("killed by signal 9")


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


class _EvilOpen:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("evil", [_Evil, _EvilOpen])
def test_import_refuses_malicious_pickle(tmp_path: Path, evil: type) -> None:
    marker = tmp_path / "pwned"
    bad = tmp_path / "snap.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "x": evil(str(marker))}))
    out = memscope("import", str(bad), "--db", str(tmp_path / "i.db"))
    assert out.returncode == 2
    assert not marker.exists()
    assert out.stderr.count("\n") == 1 and "unsafe or invalid pickle" in out.stderr
    assert "Traceback" not in out.stderr


def _frames(name: str, line: int) -> list[dict[str, object]]:
    return [{"filename": "/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
            {"filename": "/work/train.py", "line": line, "name": name}]


def test_import_snapshot_documented_format(tmp_path: Path) -> None:
    # Built by hand to the documented format of torch.cuda.memory._snapshot() (segments with
    # blocks and frames; device_traces with an 'oom' entry). NOT captured from a GPU.
    snap = {
        "segments": [
            {"device": 0, "address": 139_000_000_000, "total_size": 2 * 2 ** 30,
             "allocated_size": 2 ** 30 + 2 ** 29, "active_size": 2 ** 30 + 2 ** 29, "requested_size": 0,
             "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
             "frames": [],
             "blocks": [{"address": 139_000_000_000, "size": 2 ** 30, "requested_size": 2 ** 30,
                         "state": "active_allocated", "frames": _frames("train_step", 40)},
                        {"address": 139_000_000_000 + 2 ** 30, "size": 2 ** 29, "requested_size": 2 ** 29,
                         "state": "active_allocated", "frames": _frames("train_step", 41)},
                        {"address": 139_000_000_000 + 3 * 2 ** 29, "size": 2 ** 29, "requested_size": 0,
                         "state": "inactive", "frames": []}]},
        ],
        "device_traces": [[
            {"action": "segment_alloc", "addr": 139_000_000_000, "size": 2 * 2 ** 30, "stream": 0,
             "time_us": 1, "frames": _frames("train_step", 40)},
            {"action": "alloc", "addr": 139_000_000_000, "size": 2 ** 30, "stream": 0, "time_us": 2,
             "frames": _frames("train_step", 40)},
            {"action": "oom", "addr": 0, "size": 20 * 2 ** 20 + 512, "stream": 0, "time_us": 3,
             "device_free": 5 * 2 ** 20, "frames": _frames("train_step", 42)},
        ]],
        "allocator_settings": {"expandable_segments": False},
    }
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap))
    db = tmp_path / "s.db"
    out = memscope("import", str(path), "--db", str(db))
    assert out.returncode == 0, out.stderr
    oom = report_json(db)["oom"]
    assert oom["requested_bytes"] == 20 * 2 ** 20 + 512 and oom["live_bytes"] == 2 ** 30 + 2 ** 29
    text = cli("oom", str(db))
    assert text.returncode == 0, text.stderr
    assert "requested 20.00 MiB" in text.stdout and "device free 5.00 MiB" in text.stdout
    again = memscope("import", str(path), "--db", str(db))
    assert again.returncode == 2 and "--force" in again.stderr
    assert memscope("import", str(path), "--db", str(db), "--force").returncode == 0
    notsnap = tmp_path / "list.pickle"
    notsnap.write_bytes(pickle.dumps([1, 2, 3]))
    bad = memscope("import", str(notsnap), "--db", str(tmp_path / "n.db"))
    assert bad.returncode == 2 and "not a CUDA memory snapshot" in bad.stderr


def test_parse_requested_and_classify() -> None:
    import torch

    from memscope.agent.collectors.oom import is_oom, parse_requested

    assert parse_requested("you tried to allocate 123 bytes. Error") == (123, True)
    assert parse_requested("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has") == (20 * 2 ** 20, False)
    assert parse_requested("nothing") == (None, False)
    assert is_oom(torch.OutOfMemoryError("x")) and is_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_oom(RuntimeError("shape mismatch")) and not is_oom(ValueError("out of memory"))


@pytest.mark.cuda
def test_cuda_forward_oom(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    out = attach(db, str(EXAMPLES / "oom.py"), "--fail-step", "3", "--device", "cuda")
    assert out.returncode == 1
    oom = report_json(db)["oom"]
    assert oom["step"] == 3 and oom["phase"] == "forward" and oom["module"] == "expand"
    assert oom["requested_bytes"] >= REQUEST  # exact from the allocator observer (may be rounded up)
    assert oom["live_bytes"] > 0


OPTIM = '''
import torch, torch.nn as nn
class Greedy(torch.optim.SGD):
    def step(self, closure=None):
        if getattr(self, "n", 0) == 2:
            torch.empty(2 ** 50)  # a real allocator failure inside optimizer.step()
        self.n = getattr(self, "n", 0) + 1
        return super().step(closure)
model = nn.Linear(8, 8)
opt = Greedy(model.parameters(), lr=0.1)
for step in range(4):
    model(torch.randn(4, 8)).sum().backward()
    opt.step(); opt.zero_grad()
'''


def test_optimizer_oom(tmp_path: Path) -> None:
    script = tmp_path / "opt.py"
    script.write_text(OPTIM)
    db = tmp_path / "o.db"
    out = attach(db, str(script))
    assert out.returncode == 1, out.stderr
    report = report_json(db)
    assert report["oom"]["step"] == 2 and report["oom"]["phase"] == "optimizer"
    assert report["run"]["steps"] == 2
    text = cli("oom", str(db)).stdout
    assert "step 2, optimizer" in text and "a shape bug" in text


@pytest.mark.parametrize("catch", [False, True])
def test_whole_model_pickles_under_attach(tmp_path_factory: pytest.TempPathFactory, catch: bool) -> None:
    """torch.save of the whole module, its hooks included, under attach (made once per session:
    tests/test_oom_at_failure.py loads the --catch-forward-oom run's model without memscope)."""
    saved, out = saved_model_run(tmp_path_factory, CATCH_OPTIONS if catch else [], "plain")
    assert out.returncode == 0, out.stderr
    assert f"saved {saved.stat().st_size} bytes" in out.stdout and saved.stat().st_size > 0


DATA = Path(__file__).resolve().parent / "data"


def test_import_built_snapshot_file(tmp_path: Path) -> None:
    """tests/data/cuda_snapshot_built.pickle: built to the documented snapshot format by
    tests/data/make_snapshot.py (see tests/data/README.md), not captured on a GPU."""
    import subprocess
    import sys

    snap = DATA / "cuda_snapshot_built.pickle"
    regen = tmp_path / "again.pickle"
    subprocess.run([sys.executable, str(DATA / "make_snapshot.py"), str(regen)], check=True,
                   capture_output=True, timeout=60)
    assert regen.read_bytes() == snap.read_bytes()  # the checked-in file is the script's output
    db = tmp_path / "snap.db"
    out = memscope("import", str(snap), "--db", str(db))
    assert out.returncode == 0, out.stderr
    assert "2 segment(s) on 1 device(s), 1 out-of-memory event(s)" in out.stderr
    report = report_json(db)
    assert report["run"]["device"] == "cuda:0" and report["run"]["steps"] == 0
    oom = report["oom"]
    assert oom["requested_bytes"] == 2 ** 30 + 2 * 2 ** 20
    assert oom["live_bytes"] == 2 ** 30 + 512 * 2 ** 20 + 512  # active blocks of both segments
    assert oom["step"] is None and oom["phase"] == "other"
    text = cli("oom", str(db))
    assert text.returncode == 0, text.stderr
    assert "tried to allocate 1.00 GiB" in text.stdout
    assert "requested 1.00 GiB with 1.50 GiB allocated on cuda:0" in text.stdout
    assert "device free 300.00 MiB" in text.stdout
    doc = json.loads(cli("oom", str(db), "--json").stdout)
    details = doc["details"]
    assert details["site"] == "/home/user/train.py:44 (train_step)"  # first frame outside torch
    assert details["reserved_bytes"] == 2 * 2 ** 30 + 2 * 2 ** 20
    assert details["inactive_split_bytes"] == 512 * 2 ** 20 + 2 * 2 ** 20 - 512
    assert details["largest_free_block_bytes"] == 512 * 2 ** 20
    with sqlite3.connect(db) as conn:
        kinds = dict(conn.execute("SELECT kind, count(*) FROM events GROUP BY kind").fetchall())
        (trace,) = [json.loads(r[0]) for r in conn.execute(
            "SELECT data FROM events WHERE kind = 'snapshot_trace'")]
    # aggregates, not one row per segment: per device, per site, the largest segments
    assert kinds == {"snapshot": 1, "snapshot_device": 1, "snapshot_site": 2, "snapshot_segment": 2,
                     "snapshot_trace": 1, "oom": 1}
    assert trace["actions"] == {"segment_alloc": 2, "alloc": 4, "free_requested": 1,
                                "free_completed": 1, "oom": 1}


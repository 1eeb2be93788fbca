"""The CUDA allocator's state at an out-of-memory error, and ``memscope oom`` showing all of it.

There is no GPU here: the CUDA readings are fed from ``tests/data/cuda_state_built.json``, BUILT
BY HAND to the documented formats of ``torch.cuda.memory_stats()``, ``memory_snapshot()``,
``mem_get_info()``, the allocator's OOM observer and NVML (see tests/data/README.md and
make_cuda_state.py). The recorder that turns them into the OOM record, the run file, the report and
the command line are the real ones. Tests marked ``cuda`` run on a GPU only (``make gpu-check``);
the ones reading ``tests/data/*_real.*`` run wherever a GPU session has saved real captures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import cli, memscope, report_json
from memscope.agent.collectors import cuda
from memscope.agent.runtime.config import AgentOptions
from memscope.units import human_bytes

DATA = Path(__file__).resolve().parent / "data"
GiB, MiB = 2 ** 30, 2 ** 20


def built() -> dict[str, Any]:
    return json.loads((DATA / "cuda_state_built.json").read_text())


def test_built_file_is_the_generators_output(tmp_path: Path) -> None:
    again = tmp_path / "again.json"
    subprocess.run([sys.executable, str(DATA / "make_cuda_state.py"), str(again)], check=True,
                   capture_output=True, timeout=60)
    assert again.read_text() == (DATA / "cuda_state_built.json").read_text()


def test_allocator_state_from_memory_stats() -> None:
    b = built()
    st = cuda.allocator_state(b["memory_stats"], b["segments"])
    reserved, split = 60 * GiB, (640 + 512 + 512) * MiB
    assert st["reserved_bytes"] == reserved and st["allocated_bytes"] == reserved - split
    assert st["inactive_split_bytes"] == split and st["cached_free_bytes"] == split
    assert st["largest_free_block_bytes"] == 640 * MiB  # an inactive block, not the free total
    assert st["alloc_retries"] == 2 and st["ooms"] == 1 and st["segments"] == 3
    assert "expandable_segments" not in st
    assert cuda.allocator_state({}, None) == {
        "allocated_bytes": None, "reserved_bytes": None, "active_bytes": None, "inactive_split_bytes": None,
        "cached_free_bytes": None, "largest_free_block_bytes": None, "alloc_retries": None, "ooms": None,
        "segments": None}
    out = cuda.outside_pytorch(b["nvml"]["used"], b["nvml"]["total"], reserved, b["nvml"]["process_used"])
    assert out["outside_pytorch_bytes"] == (536 + 120) * MiB
    assert out["outside_this_process_bytes"] == 536 * MiB and out["other_processes_bytes"] == 120 * MiB
    assert cuda.outside_pytorch(None, None, reserved)["outside_pytorch_bytes"] is None
    assert cuda.expandable_segments("garbage_collection_threshold:0.6,expandable_segments:True")
    assert not cuda.expandable_segments("expandable_segments:False") and not cuda.expandable_segments(None)


class Host:
    """The agent's collector interface (memscope.agent.collectors.host.CollectorHost), recording events."""

    def __init__(self, nvml: dict[str, int] | None) -> None:
        self.options = AgentOptions()
        self.proc_id = 1
        self.running = True
        self.events: list[tuple[str, str, Any]] = []
        self._nvml = nvml

    current_step = 7
    step_start = 0.0
    phase = "other"  # the step tracker says backward, optimizer or other

    def insert(self, table: str, row: dict[str, Any]) -> bool:
        return True

    def event(self, kind: str, message: str, data: Any = None) -> None:
        self.events.append((kind, message, data))

    def optimizers(self) -> list[Any]:
        return []

    def rss(self) -> int:
        return 3 * GiB

    def latest_breakdown(self) -> dict[str, Any] | None:
        return {"step": 5, "parameters": GiB, "gradients": GiB, "optimizer_state": 2 * GiB, "activations": 40 * GiB}

    def module_prefix(self, module: Any) -> str:
        return ""

    def nvml_memory(self, index: int) -> dict[str, int] | None:
        return self._nvml

    def stop(self) -> None:
        self.running = False


def record_built_oom(monkeypatch: pytest.MonkeyPatch, conf: str = "", observer_thread: bool = False,
                     host_out: list[Any] | None = None) -> dict[str, Any]:
    """The real recorder on a CUDA OOM whose allocator readings are the built ones."""
    import torch

    from memscope.agent.collectors.oom import OomRecorder

    b = built()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", conf)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: dict(b["memory_stats"]))
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda **kw: [dict(s) for s in b["segments"]])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: tuple(b["mem_get_info"]))
    observers: list[Any] = []
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", observers.append, raising=False)
    host = Host(b["nvml"])
    rec = OomRecorder(host)
    rec.attach_cuda_observer()
    (observer,) = observers
    o = b["observer"]
    reading = (o["device"], o["requested_bytes"], o["device_limit"], o["device_free"])
    if observer_thread:  # a CUDA backward allocates on the autograd engine's thread
        t = threading.Thread(target=observer, args=reading)
        t.start()
        t.join()
    else:
        observer(*reading)  # as the allocator does
    try:
        raise torch.OutOfMemoryError(b["message"])
    except torch.OutOfMemoryError as exc:
        rec.record(exc, exc.__traceback__, where="unhandled")
    if host_out is not None:
        host_out.append((host, rec))
    (kind, _message, data), = host.events
    assert kind == "oom"
    return data  # type: ignore[no-any-return]


def test_an_observer_reading_from_the_autograd_thread_is_this_failure_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen on an H100: a backward OOM's observer ran on the engine's device thread; the record
    took the message's rounded size and the reading was left over (a second record)."""
    held: list[Any] = []
    d = record_built_oom(monkeypatch, observer_thread=True, host_out=held)
    assert d["requested_bytes"] == GiB and d["requested_exact"] is True
    assert d["device_limit_bytes"] == 85_032_419_328
    host, rec = held[0]
    rec.record_observed_leftovers(host)
    assert len(host.events) == 1  # not recorded twice


def test_recorder_reads_the_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    d = record_built_oom(monkeypatch)
    reserved, split = 60 * GiB, (640 + 512 + 512) * MiB
    assert d["device"] == "cuda:0" and d["step"] == 7 and d["phase"] == "other"
    assert d["requested_bytes"] == GiB and d["requested_exact"] is True  # the observer's, not the message's
    assert d["live_bytes"] == d["allocated_bytes"] == reserved - split
    assert d["reserved_bytes"] == reserved and d["inactive_split_bytes"] == split
    assert d["largest_free_block_bytes"] == 640 * MiB and d["cached_free_bytes"] == split
    assert d["alloc_retries"] == 2 and d["ooms"] == 1
    assert d["device_free_bytes"] == 312 * MiB and d["device_total_bytes"] == 85_032_419_328
    assert d["device_limit_bytes"] == 85_032_419_328
    assert d["outside_pytorch_bytes"] == (536 + 120) * MiB and d["other_processes_bytes"] == 120 * MiB
    assert d["expandable_segments"] is False and d["alloc_conf"] == ""
    # no CUDA tensor exists on this CPU machine: the census of cuda:0 finds none, and says so
    assert d["breakdown_at_failure"] is True and sum(d["breakdown"].values()) == 0
    assert d["profiled_breakdown"]["step"] == 5


def write_run(tmp_path: Path, data: dict[str, Any], name: str = "cuda.db") -> Path:
    """A run file of one CUDA process holding this OOM record, as the agent's writer leaves it."""
    from memscope.store.runs import create_run, finish_run, register_process
    from memscope.store.writer import connect_rw

    db = tmp_path / name
    create_run(str(db), ["python", "train.py"], started=time.time())
    proc = register_process(str(db), {"pid": 1, "argv": json.dumps(["train.py"]), "device": "cuda:0",
                                      "torch": "2.x", "started": time.time(), "status": "stopped"})
    conn = connect_rw(str(db))
    with conn:
        conn.execute("INSERT INTO events (proc, t, step, kind, message, data) VALUES (?, ?, ?, 'oom', ?, ?)",
                     (proc, time.time(), data["step"], data["message"], json.dumps(data)))
    conn.close()
    finish_run(str(db), exit_code=1, signal=None)
    return db


def assert_text_shows(details: dict[str, Any], text: str) -> None:
    """Every value ``memscope oom --json`` has under ``details`` appears in the text."""
    missing = []

    def seen(key: str, v: Any) -> bool:
        if v is None or v == "" or isinstance(v, bool):
            return True  # booleans are worded (on / off, "at the failure"), checked by the tests
        if isinstance(v, int):
            return str(v) in text or human_bytes(v) in text
        if isinstance(v, float):
            return key != "seconds" or f"{1000 * v:.0f} ms" in text
        if isinstance(v, str):
            return v in text
        if isinstance(v, list):
            return all(seen(key, x) for x in v)
        if isinstance(v, dict):
            return all(seen(k, x) for k, x in v.items())
        return False

    for key, value in details.items():
        if key in ("where",):  # worded ("seen by ...")
            continue
        if not seen(key, value):
            missing.append(key)
    assert not missing, f"in --json but not in the text: {missing}\n{text}"


def test_memscope_oom_shows_the_allocator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    db = write_run(tmp_path, record_built_oom(monkeypatch))
    text = cli("oom", str(db)).stdout
    doc = json.loads(cli("oom", str(db), "--json").stdout)
    assert_text_shows(doc["details"], text)
    assert "allocated 58.38 GiB · reserved 60.00 GiB" in text
    assert "free in the cache 1.62 GiB · largest free block 640.00 MiB · inactive split blocks 1.62 GiB" in text
    assert "2 allocation retries" in text and "expandable_segments off" in text
    assert "fragmented: the cache held enough free bytes but no block that large" in text
    assert "656.00 MiB outside PyTorch's allocator" in text and "other processes 120.00 MiB" in text
    # the cause first: fragmentation, and the fix for it
    change = text[text.index("change"):]
    assert change.startswith("change    fragmentation: 1.62 GiB was free in the cache but its largest block "
                             "was 640.00 MiB, less than the 1.00 GiB asked for; set "
                             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    tips = {t["technique"]: t for t in doc["suggestions"]}
    assert "allocator_config" in tips and "fragmentation caused" in tips["allocator_config"]["evidence"]
    report = report_json(db)
    assert report["oom"]["breakdown_step"] == 7 and report["run"]["device"] == "cuda:0"


def test_no_allocator_advice_when_expandable_segments_are_on(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    db = write_run(tmp_path, record_built_oom(monkeypatch, conf="expandable_segments:True"))
    text = cli("oom", str(db)).stdout
    doc = json.loads(cli("oom", str(db), "--json").stdout)
    assert doc["details"]["expandable_segments"] is True
    assert "expandable_segments on (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)" in text
    assert "allocator_config" not in {t["technique"] for t in doc["suggestions"]}
    assert "expandable_segments is already on: `max_split_size_mb:N`" in text


def test_imported_snapshot_text_shows_everything(tmp_path: Path) -> None:
    db = tmp_path / "snap.db"
    assert memscope("import", str(DATA / "cuda_snapshot_built.pickle"), "--db", str(db)).returncode == 0
    text = cli("oom", str(db)).stdout
    details = json.loads(cli("oom", str(db), "--json").stdout)["details"]
    assert_text_shows(details, text)
    # issue #14: the split blocks and the largest free block were in --json only
    assert "largest free block 512.00 MiB · inactive split blocks 514.00 MiB" in text
    assert "allocation site: /home/user/train.py:44 (train_step)" in text
    assert "1.00 GiB  /home/user/train.py:40 (train_step)" in text  # allocated, by site
    assert "what is allocated (1.50 GiB) must shrink" in text  # not generic batch/precision advice


# -- on a GPU only ------------------------------------------------------------------------------

GROW = '''
import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
opt = torch.optim.Adam(model.parameters())
batch = 1024
for step in range(40):
    x = torch.randn(batch, 1024, device="cuda")
    model(x).square().mean().backward()
    opt.step(); opt.zero_grad()
    batch *= 2
'''


@pytest.mark.cuda
def test_real_cuda_oom_records_the_allocator(tmp_path: Path) -> None:
    script = tmp_path / "grow.py"
    script.write_text(GROW)
    db = tmp_path / "grow.db"
    out = memscope("attach", "--headless", "--simulate-gpu", "2GiB", "--db", str(db), str(script), timeout=300)
    assert out.returncode == 1 and "OutOfMemoryError" in out.stderr
    doc = json.loads(cli("oom", str(db), "--json").stdout)
    d = doc["details"]
    assert d["device"].startswith("cuda") and d["requested_exact"] is True
    for key in ("allocated_bytes", "reserved_bytes", "inactive_split_bytes", "cached_free_bytes",
                "largest_free_block_bytes", "alloc_retries", "device_free_bytes", "device_total_bytes"):
        assert isinstance(d[key], int), key
    assert d["reserved_bytes"] <= 2 * GiB + 64 * MiB and d["device_limit_bytes"] <= 2 * GiB + MiB
    assert d["breakdown_at_failure"] is True
    bd = d["breakdown"]
    assert bd["parameters"] > 0 and bd["optimizer_state"] > 0  # Adam's state lives on the GPU
    # the census counts CUDA tensors: within the allocator's allocated bytes (rounding, caches)
    assert sum(bd.values()) <= d["allocated_bytes"] + MiB
    text = cli("oom", str(db)).stdout
    assert_text_shows(d, text)
    report = report_json(db)
    assert report["peak"]["step"] == d["step"]  # the failing step's CUDA peak is in-step


@pytest.mark.cuda
def test_real_cuda_observer_matches_the_message() -> None:
    import torch

    torch.cuda.init()
    stats = torch.cuda.memory_stats(0)
    st = cuda.allocator_state(stats, [s for s in torch.cuda.memory_snapshot() if s.get("device") == 0])
    assert st["reserved_bytes"] is not None and st["largest_free_block_bytes"] is not None


# -- real captures from a GPU session (make gpu-check), read on any machine ----------------------

REAL_STATS = DATA / "cuda_memory_stats_real.json"
REAL_SNAPSHOT = DATA / "cuda_snapshot_real.pickle"
REAL_RECORD = DATA / "cuda_oom_record_real.json"
# set by tests/gpu_check.py when it runs these tests on the captures it has just written: there a
# missing capture is a failure, not a skip (elsewhere they skip until the files are committed)
REQUIRE = os.environ.get("MEMSCOPE_TEST_REQUIRE_CAPTURES") == "1"


def real_capture(path: Path) -> Path:
    if not path.exists():
        if REQUIRE:
            pytest.fail(f"{path.name} was not captured")
        pytest.skip(f"no {path.name} capture yet (make gpu-check on a GPU writes it)")
    return path


def test_real_memory_stats_parse() -> None:
    capture = json.loads(real_capture(REAL_STATS).read_text())
    for name, reading in capture["readings"].items():
        st = cuda.allocator_state(reading["memory_stats"], reading.get("segments"))
        assert st["reserved_bytes"] is not None and st["allocated_bytes"] is not None, name
        assert st["allocated_bytes"] <= st["reserved_bytes"], name
        row = cuda.parse_memory_stats(reading["memory_stats"])
        assert all(row[c] is not None for c in cuda.STAT_COLUMNS.values()), name


def test_real_snapshot_imports(tmp_path: Path) -> None:
    db = tmp_path / "real.db"
    out = memscope("import", str(real_capture(REAL_SNAPSHOT)), "--db", str(db))
    assert out.returncode == 0, out.stderr
    text = cli("oom", str(db)).stdout
    details = json.loads(cli("oom", str(db), "--json").stdout)
    if details is not None:
        assert_text_shows(details["details"], text)


def test_real_oom_record_renders(tmp_path: Path) -> None:
    doc = json.loads(real_capture(REAL_RECORD).read_text())
    db = write_run(tmp_path, doc["details"], "real.db")
    text = cli("oom", str(db)).stdout
    assert_text_shows(doc["details"], text)


def test_cpu_oom_text_shows_everything(oom_example_run: Path) -> None:
    """examples/oom.py on CPU: no allocator fields, and the text still says all the JSON says."""
    db = oom_example_run  # the session's run of it (tests/conftest.py), failing at step 3
    d = json.loads(cli("oom", str(db), "--json").stdout)["details"]
    assert d["device"] == "cpu" and "allocated_bytes" not in d
    text = cli("oom", str(db)).stdout
    assert_text_shows(d, text)

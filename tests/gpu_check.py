"""``make gpu-check``: what only a machine with an NVIDIA GPU can check, and the real data it saves.

    make gpu-check                                   # uses .venv/bin/python, else python3
    make gpu-check GPU_PYTHON=/opt/torch/.venv/bin/python3

1. the tests marked ``cuda`` (pytest -m cuda);
2. captures, in a fresh process with the real allocator: ``torch.cuda.memory_stats()`` dicts (at
   start, after fragmenting the cache, after an OOM) with the device's ``memory_snapshot()``
   segments, the OOM observer's arguments and the error's text; a ``_snapshot()`` pickle with
   ``_record_memory_history`` on across that OOM; NVML's readings;
3. a real OOM under ``memscope attach --simulate-gpu 2GiB``: its ``memscope oom --json`` record
   and text.

Everything is written under tests/data (``*_real.*``; tests/data/README.md says what each is), and,
when ``$OUT`` is set (the device tool's output folder), copied there too. The CPU suite reads these
files (tests/test_oom_cuda.py) wherever they exist. Without a GPU it stops at once with one line.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
CUDA_TESTS = ["tests/test_cuda.py", "tests/test_oom.py", "tests/test_oom_cuda.py", "tests/test_simulate_gpu.py",
              "tests/test_layers.py", "tests/test_suggestions.py"]
MAX_SNAPSHOT = 12 * 2 ** 20  # bytes: the pickle must travel back and live in the repository
SIMULATED = "2GiB"

GROW = '''
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
opt = torch.optim.Adam(model.parameters())
batch = 1024
for step in range(40):
    x = torch.randn(batch, 1024, device="cuda")
    model(x).square().mean().backward()
    opt.step(); opt.zero_grad()
    batch *= 2  # until the allocator refuses: an OOM at a known module, step and phase
'''


def say(text: str) -> None:
    print(f"gpu-check: {text}", flush=True)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "tui"), e.get("PYTHONPATH")) if p)
    e.setdefault("PYTHONUNBUFFERED", "1")
    return e


def _compact(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Segments without their blocks' stack frames (the snapshot pickle keeps those)."""
    out = []
    for s in segments:
        s = {k: v for k, v in s.items() if k != "frames"}
        s["blocks"] = [{k: v for k, v in b.items() if k != "frames"} for b in s.get("blocks", [])]
        out.append(s)
    return out


def capture(out: Path) -> int:
    """Step 2, in its own process: a fresh CUDA context and allocator."""
    import torch

    from memscope.agent.collectors import cuda

    torch.cuda.init()
    dev = 0
    total = int(torch.cuda.get_device_properties(dev).total_memory)
    observed: list[list[int]] = []
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)  # CUDA builds only
    if attach is not None:
        attach(lambda device, alloc, limit, free: observed.append([int(device), int(alloc), int(limit), int(free)]))
    torch.cuda.memory._record_memory_history(max_entries=5000)
    readings: dict[str, Any] = {}

    def reading(name: str) -> None:
        torch.cuda.synchronize()
        segments = [s for s in torch.cuda.memory_snapshot() if s.get("device") == dev]
        readings[name] = {"memory_stats": dict(torch.cuda.memory_stats(dev)), "segments": _compact(segments),
                          "mem_get_info": [int(x) for x in torch.cuda.mem_get_info(dev)]}

    first = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    reading("start")
    # fragment the cache: 64 blocks of 20 MiB, every other one freed (split 20 MiB segments
    # come from the large pool's rounding; the freed halves stay cached and inactive)
    blocks = [torch.empty(20 << 20, dtype=torch.uint8, device="cuda") for _ in range(64)]
    del blocks[::2]
    reading("fragmented")
    torch.cuda.set_per_process_memory_fraction(min(1.0, (4 << 30) / total), dev)
    keep = []
    message = None
    try:
        while len(keep) < 64:
            keep.append(torch.empty(512 << 20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as exc:
        message = str(exc)
    reading("after_oom")
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    data = pickle.dumps(snapshot, protocol=4)
    if len(data) > MAX_SNAPSHOT:
        say(f"snapshot pickle is {len(data)} bytes, more than {MAX_SNAPSHOT}: not saved")
    else:
        (out / "cuda_snapshot_real.pickle").write_bytes(data)
    state = cuda.allocator_state(readings["after_oom"]["memory_stats"], readings["after_oom"]["segments"])
    (out / "cuda_memory_stats_real.json").write_text(json.dumps({
        "captured": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev), "total_memory": total,
        "readings": readings, "oom": {"message": message, "observer": observed},
        "allocator_state_after_oom": state}, indent=1, sort_keys=True, default=str))
    nv: dict[str, Any] = {"captured": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import pynvml

        reader = cuda.Nvml()
        nv["memory"] = dict(zip(("used", "total"), reader.memory(dev)))
        nv["process_used"] = reader.process_used(dev, os.getpid())
        handle = pynvml.nvmlDeviceGetHandleByIndex(dev)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        nv["raw_memory_info"] = {k: int(getattr(info, k)) for k in ("total", "used", "free") if hasattr(info, k)}
        nv["processes"] = [{"pid": int(p.pid), "usedGpuMemory": p.usedGpuMemory}
                           for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        nv["pid"] = os.getpid()
        nv["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        nv["torch_reserved"] = int(torch.cuda.memory_reserved(dev))
        nv["outside_pytorch"] = cuda.outside_pytorch(nv["memory"]["used"], nv["memory"]["total"],
                                                     nv["torch_reserved"], nv["process_used"])
        reader.close()
    except Exception as exc:  # no pynvml, or NVML refused: say so in the file
        nv["error"] = f"{type(exc).__name__}: {exc}"
    (out / "nvml_real.json").write_text(json.dumps(nv, indent=1, sort_keys=True, default=str))
    del first, keep
    say(f"captured allocator readings ({', '.join(readings)}), OOM {'seen' if message else 'NOT seen'}, "
        f"snapshot {len(data)} bytes, NVML {'ok' if 'error' not in nv else nv['error']}")
    return 0 if message else 1


def real_oom(out: Path) -> int:
    """Step 3: a real OOM under attach --simulate-gpu; its record and text."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "grow.py"
        script.write_text(GROW)
        db = Path(tmp) / "grow.db"
        run = subprocess.run([sys.executable, "-m", "memscope", "attach", "--headless", "--simulate-gpu", SIMULATED,
                              "--db", str(db), str(script)], env=env(), cwd=tmp, capture_output=True, text=True,
                             timeout=600)
        if run.returncode != 1 or "OutOfMemoryError" not in run.stderr:
            say(f"the growing script did not end in a CUDA OOM (exit {run.returncode}): "
                + (run.stderr.strip().splitlines() or ["no output"])[-1])
            return 1
        doc = subprocess.run([sys.executable, "-m", "memscope", "oom", str(db), "--json"], env=env(), cwd=tmp,
                             capture_output=True, text=True, timeout=120)
        text = subprocess.run([sys.executable, "-m", "memscope", "oom", str(db)], env=env(), cwd=tmp,
                              capture_output=True, text=True, timeout=120)
        if doc.returncode or text.returncode:
            say("memscope oom failed on the real record: " + (doc.stderr or text.stderr).strip())
            return 1
        (out / "cuda_oom_record_real.json").write_text(doc.stdout)
        (out / "cuda_oom_real.txt").write_text(text.stdout)
        details = json.loads(doc.stdout)["details"]
        want = ("allocated_bytes", "reserved_bytes", "inactive_split_bytes", "largest_free_block_bytes",
                "alloc_retries", "device_free_bytes", "breakdown")
        missing = [k for k in want if details.get(k) is None]
        say(f"real OOM under --simulate-gpu {SIMULATED}: step {details.get('step')}, {details.get('phase')}, "
            f"module {details.get('module')!r}, requested {details.get('requested_bytes')} bytes"
            + (f"; MISSING {missing}" if missing else ""))
        return 1 if missing else 0


PEAK_OF = """
import runpy, sys, torch
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("MAX_ALLOCATED", torch.cuda.max_memory_allocated())
"""
ESTIMATED = [str(ROOT / "examples" / "scenarios" / "nanogpt.py"), "--steps", "3", "--device", "cuda"]


def estimate_vs_real(out: Path) -> int:
    """Step 4: ``memscope estimate`` of nanoGPT on this GPU machine (its fake run hides the real
    GPU and sizes the pretend one, as on a CPU machine) against the real run's
    ``max_memory_allocated``; saved as cuda_estimate_real.json."""
    with tempfile.TemporaryDirectory() as tmp:
        wrapper = Path(tmp) / "peak_of.py"
        wrapper.write_text(PEAK_OF)
        real = subprocess.run([sys.executable, str(wrapper), *ESTIMATED], env=env(), cwd=tmp,
                              capture_output=True, text=True, timeout=300)
        lines = [ln for ln in real.stdout.splitlines() if ln.startswith("MAX_ALLOCATED")]
        if real.returncode or not lines:
            say("the real nanoGPT run failed: " + (real.stderr.strip().splitlines() or ["no output"])[-1])
            return 1
        doc: dict[str, Any] = {"captured": time.strftime("%Y-%m-%d %H:%M:%S"), "script": ESTIMATED,
                               "real_max_allocated": int(lines[-1].split()[1])}
        failed = 0
        for name, extra in (("on_the_gpu", {}),):
            est = subprocess.run([sys.executable, "-m", "memscope", "estimate", "--json", "--steps", "3",
                                  *ESTIMATED], env={**env(), **extra}, cwd=tmp, capture_output=True, text=True,
                                 timeout=300)
            if est.returncode:
                doc[name] = {"error": (est.stderr.strip().splitlines() or ["no output"])[-1]}
                failed = 1
                continue
            got = json.loads(est.stdout)
            cuda_peak = (got.get("peak_by_device") or {}).get("cuda") or {}
            doc[name] = {"allocator_peak": got.get("allocator_peak"), "cuda_peak": cuda_peak.get("peak_rounded_bytes"),
                         "peak_breakdown": got.get("peak_breakdown"), "notes": got.get("notes")}
            if cuda_peak.get("peak_rounded_bytes"):
                doc[name]["error_vs_real"] = cuda_peak["peak_rounded_bytes"] / doc["real_max_allocated"] - 1
        (out / "cuda_estimate_real.json").write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
        say("estimate of nanoGPT vs its real max_memory_allocated "
            f"{doc['real_max_allocated']}: " + "; ".join(
                f"{k} {doc[k].get('error_vs_real', doc[k].get('error'))}" for k in ("on_the_gpu",)))
        return failed


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--capture":
        return capture(Path(sys.argv[2]))
    try:
        import torch
    except ImportError:
        print("gpu-check: torch is not installed in this Python", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("gpu-check: no NVIDIA GPU here (torch.cuda.is_available() is False); run it on a machine with one",
              file=sys.stderr)
        return 1
    failed = []
    say(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, python {sys.version.split()[0]}")
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *CUDA_TESTS],
                           cwd=ROOT, env=env())
    if tests.returncode:
        failed.append("cuda tests")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        if subprocess.run([sys.executable, __file__, "--capture", str(out)], cwd=ROOT, env=env(),
                          timeout=600).returncode:
            failed.append("captures")
        if real_oom(out):
            failed.append("real OOM")
        if estimate_vs_real(out):
            failed.append("estimate on a GPU")
        saved = sorted(p.name for p in out.iterdir())
        for p in out.iterdir():
            shutil.copy(p, DATA / p.name)
            if os.environ.get("OUT"):
                shutil.copy(p, Path(os.environ["OUT"]) / p.name)
    # the CPU suite's readers of those captures, on them: a missing capture fails here
    readers = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "tests/test_oom_cuda.py", "-k", "test_real_memory_stats_parse or "
                              "test_real_snapshot_imports or test_real_oom_record_renders"], cwd=ROOT,
                             env={**env(), "MEMSCOPE_TEST_REQUIRE_CAPTURES": "1"})
    if readers.returncode:
        failed.append("the captures' readers")
    say(f"saved under tests/data: {', '.join(saved) or 'nothing'}")
    if failed:
        say(f"FAILED: {', '.join(failed)}")
        return 1
    say("all passed; commit the *_real.* files and update tests/data/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU cost of the one step a plain run measures its live-tensor peak on
(memscope.agent.collectors.peak_step): the gc walk at the step's start, a Python call per op
during it, the event at its end.

In one process, on one thread (``torch.set_num_threads(1)``: the training thread's CPU time is
the training's), a workload's steps are run alternately plain and measured (the collector's own
``step_opening`` / ``step_closed`` around it, the live tensors at its start read from the
agent's registry as under ``attach``), after warm-up steps; each step's
``time.thread_time()`` is taken. The extra work of the measured step is the difference of the
medians; its share is that against the CPU time of the workload's whole training loop (the sum
of its steps at their plain median; a run also pays the interpreter and torch's import, so the
share of a whole run is smaller still).

Workloads: ``bench``: examples/tiny_gpt.py at benchmarks/overhead.py's default config (24
steps); ``tiny``: benchmarks/tiny_steps.py (2,000 steps of about 1 ms); ``nanogpt``:
examples/scenarios/nanogpt.py at the advice table's config (24 steps counted).

    .venv/bin/python benchmarks/peak_step_cost.py              # all three, 9 pairs each
    .venv/bin/python benchmarks/peak_step_cost.py --pairs 5 --json out.json
    .venv/bin/python benchmarks/peak_step_cost.py --gc-walk    # beside the step counted from a gc walk
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import memscope.agent.runtime.agent  # noqa: E402,F401  # the objects a gc walk meets under attach
from memscope.agent.collectors.inventory import LiveTensors  # noqa: E402
from memscope.agent.collectors.peak_step import PeakStep  # noqa: E402
from memscope.agent.runtime.config import AgentOptions  # noqa: E402
from memscope.agent.torchcompat.compiled import compiled_seen  # noqa: E402


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the classes; main() is not called
    return module


def bench_step() -> tuple[Callable[[], None], int]:
    """examples/tiny_gpt.py at overhead.py's DEFAULT_CONFIG: one training step, and the run's steps."""
    tiny = _load(ROOT / "examples" / "tiny_gpt.py", "tiny_gpt")
    vocab, batch, seq = 256, 16, 128
    model = tiny.TinyGPT(vocab, 256, 4, 4, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def step() -> None:
        idx = torch.randint(0, vocab, (batch, seq + 1))
        loss = F.cross_entropy(model(idx[:, :-1]).reshape(-1, vocab), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step, 24


def tiny_step() -> tuple[Callable[[], None], int]:
    """benchmarks/tiny_steps.py: 2,000 steps of a 64-wide MLP."""
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step, 2000


def nanogpt_step() -> tuple[Callable[[], None], int]:
    """examples/scenarios/nanogpt.py at benchmarks/advice_accuracy.py's NANOGPT_ARGS, 24 steps."""
    nano = _load(ROOT / "examples" / "scenarios" / "nanogpt.py", "nanogpt")
    model = nano.GPT(65, 64, 3, 4, 96, 0.2)
    opt = model.configure_optimizers(0.1, 1e-3, "adamw")

    def step() -> None:
        x = torch.randint(0, 65, (16, 64))
        y = torch.randint(0, 65, (16, 64))
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step, 24


WORKLOADS = {"bench": bench_step, "tiny": tiny_step, "nanogpt": nanogpt_step}


class _Host:
    def __init__(self) -> None:
        self.options = AgentOptions()
        self.running = True
        self.events: list[Any] = []

    def event(self, kind: str, message: str, data: Any = None) -> None:
        self.events.append((kind, data))


def measure(name: str, pairs: int, gc_walk: bool = False, warmup: int = 3) -> dict[str, Any]:
    torch.manual_seed(0)
    live = LiveTensors()  # the agent's registry of live tensors, started before the model exists
    live.install()
    step, run_steps = WORKLOADS[name]()
    for _ in range(warmup):
        step()
    plain: list[float] = []
    measured: list[float] = []
    for _ in range(pairs):
        t = time.thread_time()
        step()
        plain.append(time.thread_time() - t)
        host = _Host()
        peak = PeakStep(host, lambda: False, None if gc_walk else live.tensors)  # type: ignore[arg-type]
        target = peak.step
        assert target is not None
        t = time.thread_time()
        peak.step_opening(target)
        step()
        peak.step_closed(target)
        measured.append(time.thread_time() - t)
        assert [k for k, _ in host.events] == ["tensor_peak"], host.events
    live.remove()
    step_s = statistics.median(plain)
    extra = statistics.median(measured) - step_s
    return {"workload": name, "start": "gc walk" if gc_walk else "registry", "run_steps": run_steps,
            "pairs": pairs, "step_cpu_ms": step_s * 1e3,
            "measured_step_cpu_ms": statistics.median(measured) * 1e3, "extra_cpu_ms": extra * 1e3,
            "share_of_training": extra / (step_s * run_steps)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=9)
    p.add_argument("--workload", action="append", choices=sorted(WORKLOADS), default=[])
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--gc-walk", action="store_true", help="also measure the step counted from a gc walk "
                   "(whatif's way) instead of the registry of live tensors")
    args = p.parse_args()
    torch.set_num_threads(1)
    compiled_seen.start()  # as the agent does at start: "is torch.compile in use?" costs no walk
    results = [measure(w, args.pairs, walk) for w in (args.workload or list(WORKLOADS))
               for walk in ((False, True) if args.gc_walk else (False,))]
    for r in results:
        print(f"{r['workload']:8} {r['start']:9} step {r['step_cpu_ms']:8.2f} ms CPU   measured step "
              f"{r['measured_step_cpu_ms']:8.2f} ms   extra {r['extra_cpu_ms']:7.2f} ms = "
              f"{r['share_of_training'] * 100:.2f}% of a {r['run_steps']}-step training loop")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

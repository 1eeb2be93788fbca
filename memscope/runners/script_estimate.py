"""``memscope estimate SCRIPT.py [ARGS...]``: the GPU peak of a script, predicted on a CPU.

The script runs for two steps on CPU under the agent (``max_steps=2``, per-layer profiling of
step 1, the first step whose breakdown includes the optimizer state the first step created).
Byte counts of parameters, gradients, optimizer state and the activations saved for backward do
not depend on the device, so their sum is the allocator's training peak on a GPU, to within:

* the CUDA context (driver, kernels; not in torch's allocator counters): a stated allowance,
  ``CUDA_CONTEXT_ALLOWANCE`` (it varies from about 300 MiB to 1 GiB with GPU and CUDA version);
* allocator rounding and fragmentation, cuBLAS / cuDNN workspaces, and temporaries that are not
  saved for backward (a few percent to tens of percent on large models);
* code paths that differ by device: fused / flash attention on CUDA saves less than the CPU
  math path, ``torch.cuda.amp`` branches, a dtype chosen by device.

Limits: the script must run on CPU. One that hard-codes ``.cuda()`` / ``device="cuda"`` dies
with "Torch not compiled with CUDA enabled" (or "no NVIDIA driver"): that is said in one line.

This module spawns the run through the supervisor's environment and never imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from memscope.agent.config import AgentOptions
from memscope.errors import UserError as CliError
from memscope.units import human_bytes
from memscope.store.reader import RunReader
from memscope.store.runs import create_run, finish_run, prepare_path
from memscope.runners.supervisor import child_environment, record_killed

CUDA_CONTEXT_ALLOWANCE = 512 << 20
COMPONENTS = ("parameters", "gradients", "optimizer_state", "activations")
_CUDA_ONLY = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver",
              "No CUDA GPUs are available", "CUDA driver initialization failed")


@dataclass
class ChildRun:
    db: str
    log: str
    exit_code: int | None
    signal: int | None

    @property
    def ok(self) -> bool:
        return self.signal is None and self.exit_code == 0

    def last_error(self) -> str:
        """The last non-empty line of the child's output (its exception, usually)."""
        try:
            with open(self.log, errors="replace") as f:
                lines = [ln.strip() for ln in f if ln.strip()]
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def log_mentions(self, needles: Sequence[str]) -> bool:
        try:
            with open(self.log, errors="replace") as f:
                text = f.read()
        except OSError:
            return False
        return any(n in text for n in needles)


def run_recorded(script: str, script_args: Sequence[str], db: str,
                 options: dict[str, Any]) -> ChildRun:
    """Run ``python SCRIPT ARGS`` under the agent into a fresh run file ``db``; the child's
    output goes to ``db`` with ``.log`` instead of ``.db``, not to this terminal."""
    opts = AgentOptions.from_mapping(options)
    command = [sys.executable, script, *script_args]
    prepare_path(db, force=True)
    create_run(db, ["python", script, *script_args])
    log = os.path.splitext(db)[0] + ".log"
    with open(log, "w") as out:
        try:
            proc = subprocess.run(command, env=child_environment(db, opts.to_json(), command),
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        except OSError as exc:
            finish_run(db, exit_code=127, signal=None)
            raise CliError(f"cannot start {command[0]}: {exc.strerror}") from None
    code, sig = (None, -proc.returncode) if proc.returncode < 0 else (proc.returncode, None)
    if sig is not None:
        record_killed(db, sig)
    finish_run(db, code, sig)
    return ChildRun(db, log, code, sig)


@dataclass
class ScriptEstimate:
    script: str
    db: str
    step: int
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    allocator_peak: int  # the four above
    cuda_context: int
    device_total: int  # what nvidia-smi would show, roughly


def estimate_from_run(reader: RunReader, script: str) -> ScriptEstimate | None:
    """The estimate from the last profiled step's breakdown of the main process."""
    rows = reader.query("SELECT * FROM step_breakdown ORDER BY step DESC, proc LIMIT 1")
    if not rows:
        return None
    r = rows[0]
    parts = {k: int(r[k] or 0) for k in COMPONENTS}
    total = sum(parts.values())
    return ScriptEstimate(script, reader.path, int(r["step"]), **parts, allocator_peak=total,
                          cuda_context=CUDA_CONTEXT_ALLOWANCE,
                          device_total=total + CUDA_CONTEXT_ALLOWANCE)


def render(e: ScriptEstimate) -> str:
    lines = [f"estimated GPU peak of {e.script} (measured on CPU, step {e.step}; byte counts do "
             "not depend on the device)"]
    for k in COMPONENTS:
        lines.append(f"  {k.replace('_', ' '):<18}{human_bytes(getattr(e, k)):>12}")
    lines.append(f"  {'allocator peak':<18}{human_bytes(e.allocator_peak):>12}  "
                 "(torch.cuda.max_memory_allocated)")
    lines.append(f"  {'+ CUDA context':<18}{human_bytes(e.cuda_context):>12}  (allowance; "
                 "300 MiB to 1 GiB by GPU and CUDA version)")
    lines.append(f"  {'device total':<18}{human_bytes(e.device_total):>12}  (about what "
                 "nvidia-smi shows)")
    lines.append("  not counted: allocator rounding and fragmentation, cuBLAS/cuDNN workspaces, "
                 "temporaries not saved for backward, CUDA-only code paths (flash attention)")
    lines.append(f"  run file: {e.db}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Entry point for ``memscope estimate SCRIPT.py ...`` (args.script, args.script_args)."""
    script = args.script
    if not os.path.isfile(script):
        raise CliError(f"estimate: no such script: {script}")
    workdir = getattr(args, "db_dir", None) or tempfile.mkdtemp(prefix="memscope-estimate-")
    stem = os.path.splitext(os.path.basename(script))[0]
    db = os.path.join(workdir, f"estimate-{stem}.db")
    child = run_recorded(script, list(getattr(args, "script_args", None) or []), db,
                         {"max_steps": 2, "layers_every": 1, "layers_first": 1,
                          "inventory_every": 0})
    if not child.ok:
        if child.log_mentions(_CUDA_ONLY):
            raise CliError(f"estimate: {script} needs CUDA (it hard-codes .cuda() or "
                           "device='cuda'), so it cannot be estimated on CPU")
        why = f"signal {child.signal}" if child.signal is not None else f"exit {child.exit_code}"
        raise CliError(f"estimate: {script} failed on CPU ({why}): {child.last_error()} "
                       f"(log: {child.log})")
    with RunReader(db) as reader:
        est = estimate_from_run(reader, script)
    if est is None:
        raise CliError(f"estimate: {script} completed no profiled training step (it needs at "
                       f"least 2 steps with a backward); run file: {db}")
    if getattr(args, "json", False):
        print(json.dumps({"schema": "memscope.estimate/1", **asdict(est)}, indent=2))
    else:
        print(render(est))
    return 0

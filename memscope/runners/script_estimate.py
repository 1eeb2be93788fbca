"""``memscope estimate SCRIPT.py [ARGS...]``: the GPU peak of a script, predicted on a CPU.

Two methods, both counting tensor bytes, which do not depend on the device:

* ``fake`` (the default): the script's first steps run under FakeTensorMode
  (memscope.runners.fake_estimate, memscope.agent.fake.fakerun): every tensor has its shape and
  dtype and no memory, so a 7B model "trains" on a laptop; a script that says ``.cuda()`` gets
  a pretend GPU. The peak is the exact peak of live tensor bytes, temporaries included, the
  same figure ``whatif`` measures on real runs; with each allocation rounded up to the CUDA
  caching allocator's 512-byte blocks it is what ``torch.cuda.max_memory_allocated`` reports.
* ``measured`` (``--measure``): two real steps on CPU under the agent (``max_steps=2``,
  per-layer profiling and the exact live-tensor peak of step 1). The script must run on CPU and
  fit in this machine's memory; one that hard-codes ``.cuda()`` is said in one line.

Both add a stated allowance for the CUDA context (``CUDA_CONTEXT_ALLOWANCE``; 300 MiB to 1 GiB
by GPU and CUDA version). Not counted: the caching allocator's fragmentation (reserved above
allocated), cuBLAS / cuDNN workspaces, and code paths that differ on a GPU (flash attention
kernels, fused optimizers).

This module spawns the runs and never imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from memscope.agent.runtime.config import AgentOptions
from memscope.errors import UserError as CliError
from memscope.units import human_bytes
from memscope.store.reader import RunReader
from memscope.safe_files import file_mode, new_temp, put_in_place, target
from memscope.store.runs import create_run, finish_run, prepare_path
from memscope.runners.fake_estimate import FakeResult, FakeRunner
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
                 options: dict[str, Any], extra_path: str | None = None,
                 group_readable: bool = False) -> ChildRun:
    """Run ``python SCRIPT ARGS`` under the agent into a fresh run file ``db``; the child's
    output goes to ``db`` with ``.log`` instead of ``.db``, not to this terminal.
    ``extra_path``: a directory the child finds modules in after the script's own (a patched
    copy's original directory). Both files are memscope's names in a directory the user may
    have given (``--db-dir``): made the safe way (memscope/safe_files.py), 0600 or 0640."""
    opts = AgentOptions.from_mapping(options)
    command = [sys.executable, script, *script_args]
    log = os.path.splitext(db)[0] + ".log"
    target(log, named=False)  # a link or a FIFO at the log's name: refused, before the run
    prepare_path(db, force=True)
    create_run(db, ["python", script, *script_args], group_readable=group_readable)
    env = child_environment(db, opts.to_json(), command)
    if extra_path:
        env["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + extra_path
    fd, tmp = new_temp(os.path.dirname(os.path.abspath(log)), os.path.basename(log), file_mode(group_readable))
    with open(fd, "w") as out:
        try:
            proc = subprocess.run(command, env=env,
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        except OSError as exc:
            finish_run(db, exit_code=127, signal=None)
            os.remove(tmp)
            raise CliError(f"cannot start {command[0]}: {exc.strerror}") from None
        except BaseException:
            os.remove(tmp)
            raise
    put_in_place(tmp, log)
    code, sig = (None, -proc.returncode) if proc.returncode < 0 else (proc.returncode, None)
    if sig is not None:
        record_killed(db, sig)
    finish_run(db, code, sig)
    return ChildRun(db, log, code, sig)


@dataclass
class ScriptEstimate:
    method: str  # "fake" or "measured"
    script: str
    db: str | None  # the run file of a measured estimate
    step: int  # the step whose figures these are
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int  # saved for backward, the most alive at once
    allocator_peak: int  # the live-tensor peak as the CUDA allocator counts it (see the doc)
    tensor_peak: int | None  # the exact peak of live tensor bytes
    sum_of_parts: int  # the four above added: not the peak (temporaries, timing)
    cuda_context: int
    device_total: int  # what nvidia-smi would show, roughly
    peak_breakdown: dict[str, int] | None = None  # what was live at the peak, by category
    modules: list[dict[str, Any]] = field(default_factory=list)  # activations per module
    placeholders: list[dict[str, Any]] = field(default_factory=list)  # data-dependent scalars
    notes: list[str] = field(default_factory=list)
    # files the script wrote, renamed or removed, diverted to a scratch directory (fake runs)
    diverted: list[dict[str, Any]] = field(default_factory=list)
    # each device's own peak (fake runs): {"cuda": {"peak_bytes", "peak_rounded_bytes",
    # "breakdown"}, "cpu": {...}}; the GPU figures above exclude the tensors kept on the CPU
    peak_by_device: dict[str, dict[str, Any]] | None = None

    def as_json(self) -> dict[str, Any]:
        return {"schema": "memscope.estimate/1", **asdict(self)}


def estimate_from_run(reader: RunReader, script: str) -> ScriptEstimate | None:
    """The measured estimate: the last profiled step's breakdown of the main process and the
    highest exact live-tensor peak of the run (``tensor_peak`` events)."""
    rows = reader.query("SELECT * FROM step_breakdown ORDER BY step DESC, proc LIMIT 1")
    if not rows:
        return None
    r = rows[0]
    parts = {k: int(r[k] or 0) for k in COMPONENTS}
    total = sum(parts.values())
    peaks = [int(e["data"]["peak_bytes"]) for e in reader.events("tensor_peak")
             if isinstance(e["data"], dict) and e["data"].get("peak_bytes") is not None]
    peak = max(peaks) if peaks else None
    notes = []
    if peak is None:
        notes.append("no live-tensor peak was measured: the allocator peak is the sum of the parts")
    allocator = peak if peak is not None else total
    return ScriptEstimate("measured", script, reader.path, int(r["step"]), parts["parameters"],
                          parts["gradients"], parts["optimizer_state"], parts["activations"],
                          allocator_peak=allocator, tensor_peak=peak, sum_of_parts=total,
                          cuda_context=CUDA_CONTEXT_ALLOWANCE,
                          device_total=allocator + CUDA_CONTEXT_ALLOWANCE, notes=notes)


def estimate_from_fake(result: FakeResult, script: str) -> ScriptEstimate:
    """The fake estimate: the states at the last step, the activations and the peak of the
    step that peaked highest."""
    steps = result.steps
    by_device = {d: v for d, v in (result["peak_by_device"] or {}).items() if isinstance(v, dict)}
    gpu = by_device.get("cuda")

    def step_peak(s: dict[str, Any]) -> int:
        if gpu is not None:  # the GPU's own peak: tensors kept on the CPU are host memory
            return int(((s.get("peak_by_device") or {}).get("cuda") or {}).get("peak_bytes") or 0)
        return int(s["peak_bytes"])

    top = max(steps, key=step_peak) if steps else {}
    parts = {k: int(result[k] or 0) for k in COMPONENTS}
    rounded, peak, breakdown = result.peak_rounded, result.peak, result["peak_breakdown"]
    if gpu is not None:
        rounded, peak = int(gpu["peak_rounded_bytes"]), int(gpu["peak_bytes"])
        breakdown = gpu.get("breakdown") or breakdown
    modules = sorted((m for m in result["modules"] or [] if m.get("saved_bytes")),
                     key=lambda m: -m["saved_bytes"])
    notes = []
    if any(p.get("kind") in ("int", "size") for p in result["placeholders"] or []):
        notes.append("an integer or a size the script read from tensor values was replaced by a "
                     "placeholder: sizes that depend on it may be wrong")
    if result["uncounted_sparse"]:
        notes.append(f"{result['uncounted_sparse']} sparse tensor(s) not counted (a sparse embedding's "
                     "gradient, say): a fake run cannot know how many values they hold; --measure can")
    if gpu is None and by_device:
        notes.append("the script put no tensor on a GPU: the peak is of its CPU tensors, what a GPU "
                     "would hold if it moved them all")
    return ScriptEstimate("fake", script, None, int(top.get("step", 0)), **parts,
                          allocator_peak=rounded, tensor_peak=peak,
                          sum_of_parts=sum(parts.values()), cuda_context=CUDA_CONTEXT_ALLOWANCE,
                          device_total=rounded + CUDA_CONTEXT_ALLOWANCE,
                          peak_breakdown=breakdown, modules=modules,
                          placeholders=list(result["placeholders"] or []), notes=notes,
                          diverted=list(result["diverted"] or []),
                          peak_by_device={d: {k: v[k] for k in ("peak_bytes", "peak_rounded_bytes", "breakdown")
                                              if k in v} for d, v in by_device.items()} or None)


def render(e: ScriptEstimate) -> str:
    if e.method == "fake":
        how = f"fake run under FakeTensorMode, nothing allocated; peak in step {e.step}"
    else:
        how = f"measured on CPU, step {e.step}"
    lines = [f"estimated GPU peak of {e.script} ({how}; byte counts do not depend on the device)"]
    for k in COMPONENTS:
        lines.append(f"  {k.replace('_', ' '):<18}{human_bytes(getattr(e, k)):>12}"
                     + ("  (saved for backward, the most alive at once)" if k == "activations" else ""))
    lines.append(f"  {'sum of the four':<18}{human_bytes(e.sum_of_parts):>12}  (not the peak: "
                 "temporaries add, states and activations peak at different moments)")
    if e.tensor_peak is not None:
        extra = e.tensor_peak - e.sum_of_parts
        lines.append(f"  {'live-tensor peak':<18}{human_bytes(e.tensor_peak):>12}  (every tensor "
                     f"alive at once, exact; {'+' if extra >= 0 else '-'}{human_bytes(abs(extra))} "
                     "against the sum)")
    label = ("(torch.cuda.max_memory_allocated: each allocation rounded up to 512 B)"
             if e.method == "fake" else "(torch.cuda.max_memory_allocated, before 512-byte rounding)")
    lines.append(f"  {'allocator peak':<18}{human_bytes(e.allocator_peak):>12}  {label}")
    lines.append(f"  {'+ CUDA context':<18}{human_bytes(e.cuda_context):>12}  (allowance; "
                 "300 MiB to 1 GiB by GPU and CUDA version)")
    lines.append(f"  {'device total':<18}{human_bytes(e.device_total):>12}  (about what "
                 "nvidia-smi shows, before the caching allocator's fragmentation)")
    host = (e.peak_by_device or {}).get("cpu")
    if host and (e.peak_by_device or {}).get("cuda"):
        lines.append(f"  {'host tensors':<18}{human_bytes(int(host.get('peak_bytes') or 0)):>12}  (kept on "
                     "the CPU by the script, at their peak: host memory, not in the GPU figures)")
    if e.peak_breakdown:
        lines.append("  at the peak: " + " · ".join(
            f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in e.peak_breakdown.items()))
    if e.modules:
        top = e.modules[:5]
        lines.append("  activations by module: " + " · ".join(
            f"{m['module'] or '(model)'}{' (' + m['type'] + ')' if m.get('type') else ''} "
            f"{human_bytes(m['saved_bytes'])}" for m in top)
            + (f" · {len(e.modules) - 5} more" if len(e.modules) > 5 else ""))
    for p in e.placeholders[:3]:
        lines.append(f"  placeholder: {p['site']} x{p['count']} (a fake run has no values)")
    lines.extend(f"  note: {n}" for n in e.notes)
    lines.extend(diverted_lines(e.diverted))
    lines.append("  not counted: allocator fragmentation, cuBLAS/cuDNN workspaces, CUDA-only code "
                 "paths (flash attention, fused optimizers)")
    if e.db:
        lines.append(f"  run file: {e.db}")
    return "\n".join(lines)


def _shown(text: str, limit: int = 160) -> str:
    """A path of the user's for the terminal: no control or bidi characters, bounded."""
    out = "".join(c if c.isprintable() else "?" for c in text)
    return out if len(out) <= limit else out[:limit // 2 - 1] + "…" + out[-(limit // 2):]


def diverted_lines(diverted: list[dict[str, Any]], shown: int = 5) -> list[str]:
    """What the fake run kept from the user's files: each path and what the script did to it."""
    if not diverted:
        return []
    out = [f"  files: the script wrote to {len(diverted)} path{'s' if len(diverted) != 1 else ''}; "
           "a fake run diverts every write to a scratch copy, yours are unchanged"]
    for d in diverted[:shown]:
        path = str(d.get("path", "?"))
        rel = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
        out.append(f"    {_shown(rel)} ({', '.join(_shown(str(o)) for o in d.get('ops') or [])})")
    if len(diverted) > shown:
        out.append(f"    {len(diverted) - shown} more (--json lists them)")
    return out


_HINT_FLAGS = ("--json", "--measure", "--steps", "--cpu")


def _hint(script_args: Sequence[str], error: str) -> str:
    """memscope's own options after the script go to the script: say so when it choked."""
    mine = [a for a in script_args if a.split("=")[0] in _HINT_FLAGS]
    if mine and ("unrecognized arguments" in error or "exited with status 2" in error):
        return (f" ({' '.join(mine)} went to the script: memscope's options go before it, "
                "e.g. memscope estimate --json SCRIPT.py ARGS)")
    return ""


def run_fake(script: str, script_args: Sequence[str], steps: int = 2, pretend_cuda: bool = True,
             workdir: str | None = None, runner: FakeRunner | None = None) -> ScriptEstimate:
    """The fake estimate (a warm ``runner`` may be passed in; else one is started)."""
    if runner is not None:
        result = runner.run(script, script_args, steps=steps, pretend_cuda=pretend_cuda)
    else:
        with FakeRunner(workdir) as own:
            result = own.run(script, script_args, steps=steps, pretend_cuda=pretend_cuda)
    if not result.ok:
        if result["status"] == "ended" and not result.steps:
            raise CliError(f"estimate: {script} completed no training step in the fake run (a "
                           "step is an optimizer.step(), or a backward without an optimizer); "
                           f"log: {result.log}")
        error = result.error or "ended early"
        if result["status"] == "exit":
            error += ": " + _last_line(result.log)
        if result["placeholders"] and "depends on tensor values" not in error:
            n = sum(int(p.get("count") or 0) for p in result["placeholders"])
            error += (f" (the script read {n} value{'s' if n != 1 else ''} from tensors, which a fake "
                      "run does not have: it got 1.0, 0 or False instead)")
        raise CliError(f"estimate: {script} failed in the fake run: {error}"
                       f"{_hint(script_args, error)} (log: {result.log}; "
                       "memscope estimate --measure runs real steps on CPU instead)")
    return estimate_from_fake(result, script)


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run_measured(script: str, script_args: Sequence[str], workdir: str) -> ScriptEstimate:
    stem = os.path.splitext(os.path.basename(script))[0]
    db = os.path.join(workdir, f"estimate-{stem}.db")
    child = run_recorded(script, list(script_args), db,
                         {"max_steps": 2, "layers_every": 1, "layers_first": 1,
                          "inventory_every": 0, "tensor_peak": True})
    if not child.ok:
        if child.log_mentions(_CUDA_ONLY):
            raise CliError(f"estimate: {script} needs CUDA (it hard-codes .cuda() or "
                           "device='cuda'), so it cannot be estimated on CPU")
        why = f"signal {child.signal}" if child.signal is not None else f"exit {child.exit_code}"
        raise CliError(f"estimate: {script} failed on CPU ({why}): {child.last_error()}"
                       f"{_hint(script_args, 'exited with status 2' if child.exit_code == 2 else '')} "
                       f"(log: {child.log})")
    with RunReader(db) as reader:
        est = estimate_from_run(reader, script)
    if est is None:
        raise CliError(f"estimate: {script} completed no profiled training step (it needs at "
                       f"least 2 steps with a backward); run file: {db}")
    return est


def run(args: argparse.Namespace, progress: Callable[[str], None] | None = None) -> int:
    """Entry point for ``memscope estimate [OPTIONS] SCRIPT.py ARGS`` (args.script, args.script_args);
    ``progress`` is told what runs (memscope.cli.progress)."""
    say = progress or (lambda _text: None)
    script = args.script
    if not os.path.isfile(script):
        raise CliError(f"estimate: no such script: {script}")
    script_args = list(getattr(args, "script_args", None) or [])
    workdir = getattr(args, "db_dir", None) or tempfile.mkdtemp(prefix="memscope-estimate-")
    if getattr(args, "measure", False):
        say(f"2 real steps of {script} on CPU")
        est = run_measured(script, script_args, workdir)
    else:
        steps = int(getattr(args, "steps", None) or 2)
        if steps < 1:
            raise CliError("estimate: --steps must be at least 1")
        say(f"a fake run of {script} (python starts and imports torch first)")
        est = run_fake(script, script_args, steps=steps, pretend_cuda=not getattr(args, "cpu", False),
                       workdir=workdir)
        if not getattr(args, "db_dir", None):
            shutil.rmtree(workdir, ignore_errors=True)  # the logs matter only when it failed
    if getattr(args, "json", False):
        print(json.dumps(est.as_json(), indent=2))
    else:
        print(render(est))
    return 0

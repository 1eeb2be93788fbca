"""Run one training script three ways and compare: plain ``python``, ``memscope attach`` at
its defaults, and attach at its most invasive settings.

Each case script (tests/compat/cases/) takes the path of an output file as its first argument,
trains with fixed seeds, and ends with :func:`cases._common.finish`, which saves the losses, the
final parameters and any extra facts (torch.compile's graph counters) with ``torch.save`` and
prints :data:`END` on stderr as its last line.

**What is memscope's own output.** Under attach, memscope's supervisor prints its lines on its
stderr after the training process exited; the training's stdout and stderr go straight to the
same streams. So in an attach run, everything after the script's last :data:`END` line on stderr
is memscope's, and every such line must start with ``memscope: ``; everything before it is the
training's and must be what plain ``python`` printed: the same lines, after digits, hex
addresses and the per-arm paths are normalised (timings, pids and ports differ between runs).
stdout must match the same way.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases"
ROOT = HERE.parent.parent
END = "compat: end of script"

ARMS: dict[str, list[str] | None] = {
    "plain": None,
    "default": [],
    "invasive": ["--layers-every", "1", "--layers-first", "0", "--inventory-every", "1",
                 "--catch-forward-oom"],
}


@dataclass
class Arm:
    name: str
    returncode: int
    stdout: str
    stderr: str
    out: dict[str, Any]
    db: Path | None
    memscope_lines: list[str] = field(default_factory=list)
    training_stderr: str = ""


def torchrun_prefix(nproc: int = 2) -> list[str]:
    from conftest import free_port  # tests/conftest.py

    exe = Path(sys.executable).parent / "torchrun"
    if not exe.exists():
        pytest.skip("torchrun not installed beside this Python")
    return [str(exe), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
            "--master-port", str(free_port())]


def run_arm(name: str, tmp_path: Path, script: str, args: list[str], *, torchrun: int = 0,
            env: dict[str, str] | None = None, timeout: float = 240) -> Arm:
    out = tmp_path / f"{name}.pt"
    db = tmp_path / f"{name}.db"
    workdir = tmp_path / name
    workdir.mkdir(exist_ok=True)
    target = [str(CASES / script), str(out), *args]
    if torchrun:
        command = [*torchrun_prefix(torchrun), *target]
    else:
        command = [sys.executable, *target]
    flags = ARMS[name]
    if flags is not None:
        command = [sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db),
                   *flags, "--", *command]
    full_env = dict(os.environ)
    full_env.update({"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0",
                     # compiled code is shared by the three arms (as on a user's machine): only
                     # the first arm pays for Inductor's C++ builds
                     "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-cache"),
                     # the interpreter's exit as a user's: a finalizer's noise there shows
                     "MEMSCOPE_TEST_SLOW_EXIT": "1"})
    full_env.pop("MEMSCOPE_DB", None)
    if env:
        full_env.update(env)
    proc = subprocess.run(command, cwd=workdir, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    results: dict[str, Any] = {}
    if torchrun:
        for r in range(torchrun):
            path = Path(f"{out}.rank{r}")
            if path.exists():
                results[f"rank{r}"] = _load(path)
    elif out.exists():
        results = _load(out)
    arm = Arm(name, proc.returncode, proc.stdout, proc.stderr, results,
              db if flags is not None else None)
    _split_stderr(arm)
    return arm


def _load(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=False)


def _split_stderr(arm: Arm) -> None:
    """Under attach: the training's stderr ends with its last END line; the rest is memscope's."""
    lines = arm.stderr.splitlines()
    if arm.db is None:
        cut = len(lines)
    else:
        ends = [i for i, ln in enumerate(lines) if ln == END]
        cut = ends[-1] + 1 if ends else 0
    arm.training_stderr = "\n".join(lines[:cut])
    arm.memscope_lines = lines[cut:]


_NOISE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    (re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?"), "N"),
]


def normalise(text: str, tmp_path: Path) -> list[str]:
    text = text.replace(str(tmp_path), "TMP")
    for name in ARMS:  # per-arm output paths
        text = text.replace(f"{name}.pt", "OUT.pt").replace(f"{name}.db", "OUT.db")
    for pattern, repl in _NOISE:
        text = pattern.sub(repl, text)
    return sorted(ln.rstrip() for ln in text.splitlines() if ln.strip())


def run_three(tmp_path: Path, script: str, args: list[str] | None = None, *, torchrun: int = 0,
              env: dict[str, str] | None = None, timeout: float = 240) -> dict[str, Arm]:
    """The three arms: plain first (it fills the compile caches), then the two attached arms
    side by side (each single-threaded: OMP_NUM_THREADS=1)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> Arm:
        return run_arm(name, tmp_path, script, list(args or []), torchrun=torchrun, env=env,
                       timeout=timeout)

    arms = {"plain": one("plain")}
    with ThreadPoolExecutor(2) as pool:
        arms.update(zip(("default", "invasive"), pool.map(one, ("default", "invasive"))))
    return arms


def read_rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def report(db: Path) -> dict[str, Any]:
    from memscope.report.json_report import build_report
    from memscope.store.reader import RunReader

    with RunReader(db) as reader:
        return build_report(reader)


def equal_tensors(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two saved structures differ (tensors compared with torch.equal: bit-identical)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{where}: tensor vs {type(b).__name__}"]
        if a.layout != b.layout:
            return [f"{where}: layout {a.layout} vs {b.layout}"]
        if a.is_sparse:
            a, b = a.coalesce().to_dense(), b.coalesce().to_dense()
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            return [f"{where}: differs"]
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(a)} vs {sorted(b)}"]
        return [d for k in a for d in equal_tensors(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in equal_tensors(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def check(arms: dict[str, Arm], tmp_path: Path, steps: int, *, processes: int = 1) -> None:
    """What every case asserts for every arm (see the module doc)."""
    plain = arms["plain"]
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert plain.out, "the script saved nothing"
    assert END in plain.stderr.splitlines(), plain.stderr[-2000:]
    for name in ("default", "invasive"):
        arm = arms[name]
        where = f"[{name}]"
        assert arm.returncode == plain.returncode, f"{where} exit {arm.returncode}\n{arm.stderr[-3000:]}"
        # the training's results, bit for bit
        diffs = equal_tensors(plain.out, arm.out, "out")
        assert not diffs, f"{where} results differ from plain python: {diffs[:5]}"
        # the training's own output, unchanged; memscope's lines after it, all its own
        assert normalise(arm.stdout, tmp_path) == normalise(plain.stdout, tmp_path), \
            f"{where} stdout differs:\n{arm.stdout[-2000:]}\n--- plain ---\n{plain.stdout[-2000:]}"
        assert normalise(arm.training_stderr, tmp_path) == normalise(plain.stderr, tmp_path), \
            f"{where} stderr differs:\n{arm.training_stderr[-3000:]}\n--- plain ---\n{plain.stderr[-3000:]}"
        assert arm.memscope_lines and all(ln.startswith("memscope: ") for ln in arm.memscope_lines), \
            f"{where} after the script's end: {arm.memscope_lines}"
        # the run file: every process, the exact step count, no leak on a healthy loop
        assert arm.db is not None and arm.db.exists()
        procs = read_rows(arm.db, "SELECT id, status FROM processes")
        assert len(procs) == processes and all(s == "stopped" for _, s in procs), procs
        for pid, _ in procs:
            n = read_rows(arm.db, "SELECT COUNT(*) FROM steps WHERE proc = ? AND status = 'ok'",
                          (pid,))[0][0]
            assert n == steps, f"{where} process {pid}: {n} steps, not {steps}"
        disabled = read_rows(arm.db, "SELECT message FROM events WHERE kind = 'collector_disabled'")
        assert not disabled, f"{where} {disabled}"
        rep = report(arm.db)
        assert rep["run"]["steps"] == steps and rep["run"]["exit_code"] == plain.returncode
        assert rep["leaks"] == [], f"{where} leaks on a healthy loop: {rep['leaks']}"
    # the invasive arm really looked: every step profiled and inventoried
    inv = arms["invasive"]
    assert inv.db is not None
    profiled = read_rows(inv.db, "SELECT COUNT(DISTINCT step) FROM layer_stats")[0][0]
    assert profiled == steps, f"[invasive] {profiled} profiled steps of {steps}"
    inventories = read_rows(inv.db, "SELECT COUNT(DISTINCT step) FROM inventories")[0][0]
    assert inventories >= steps - 2, f"[invasive] {inventories} inventories in {steps} steps"


def layer_rows(db: Path, step: int | None = None) -> dict[str, tuple[str, int, int]]:
    """module -> (type, calls, saved_bytes) of one profiled step (default: the last)."""
    if step is None:
        step = read_rows(db, "SELECT MAX(step) FROM layer_stats")[0][0]
    rows = read_rows(db, "SELECT module, type, calls, saved_bytes FROM layer_stats WHERE step = ?"
                         " AND proc = (SELECT MIN(proc) FROM layer_stats)", (step,))
    return {m: (t, c, b) for m, t, c, b in rows}

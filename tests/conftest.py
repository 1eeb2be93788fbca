"""Shared helpers: run the real CLI in a subprocess, read real run files."""

from __future__ import annotations

import os

# One compute thread in every process the tests start (and in the workers): two xdist workers on
# a 2-core machine each running a two-thread torch made OpenMP threads spin against each other
# (a pair of attach runs: 30% more wall time, 25% more CPU). Before torch is imported anywhere.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# Their last garbage collection skipped (tests/fastexit/sitecustomize.py says why and which tests
# keep it). Last on PYTHONPATH: a sitecustomize a test puts there (tests/mutants') comes first.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [*(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not p.endswith("fastexit")),
     os.path.join(os.path.dirname(os.path.abspath(__file__)), "fastexit")])

import contextlib
import io
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shared_runs import shared_attach, shared_ddp  # noqa: F401 (shared_ddp: tests/tui/conftest.py)
from suite_order import heaviest_first

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"
EXAMPLES = ROOT / "examples"


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    heaviest_first(items)  # for make test's xdist workers (tests/suite_order.py)
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def memscope(*args: str, cwd: Path | str = ROOT, env: dict[str, str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python -m memscope ARGS`` as a user would, capturing its output."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-m", "memscope", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    """A free TCP port on loopback, for a torchrun rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(nproc: int = 2) -> list[str]:
    """The start of a single-node ``torchrun`` command on loopback (skips without torchrun)."""
    exe = Path(sys.executable).parent / "torchrun"
    if not exe.exists():
        pytest.skip("torchrun not installed beside this Python")
    return [str(exe), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
            "--master-port", str(free_port())]


# The reading commands whose output a test reads as data can run in this process (``cli``):
# ``python -m memscope`` is ``sys.exit(main(argv))``, so main's exit status and output are the
# subprocess's, without an interpreter start each (~0.4 s, a few hundred calls in the suite).
# Where the claim is about the process itself (one error line and an exit status from a real
# process: tests/test_bad_input.py, tests/faults/), ``memscope`` runs a real one.
IN_PROCESS = {"report", "leaks", "oom", "layers", "diff"}


def cli(*args: str, cwd: Path | str = ROOT, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``memscope ARGS``'s exit status, stdout and stderr: a reading command in this process
    (where a subprocess would see what this process sees), anything else as :func:`memscope`."""
    if args[0] not in IN_PROCESS or env is not None or Path(cwd).resolve() != Path.cwd().resolve():
        return memscope(*args, cwd=cwd, env=env, timeout=timeout)
    from memscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # --help: argparse exits
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess([sys.executable, "-m", "memscope", *args], code,
                                       out.getvalue(), err.getvalue())


def report_json(db: Path | str) -> dict[str, Any]:
    out = cli("report", str(db), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="session")
def oom_example_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run of examples/oom.py: 3 completed steps, then a CPU allocator OOM in the forward
    of step 3 (read, never written, by the tests that share it: the exports' and the dashboard's,
    on either xdist worker: tests/shared_runs.py)."""
    db, out = shared_attach(tmp_path_factory, ["--sample-hz", "50"], ["examples/oom.py", "--fail-step", "3"])
    assert out.returncode == 1, out.stderr
    return db


@pytest.fixture
def run_db(tmp_path: Path) -> Path:
    return tmp_path / "run.db"


@pytest.fixture
def live() -> Any:
    """The agent's registry of live tensors, installed for one test and removed after it (torch
    imported here, not at the top: the dashboard's tests never need it)."""
    from memscope.agent.collectors.inventory import LiveTensors

    reg = LiveTensors()
    reg.install()
    yield reg
    reg.remove()


def forget_compiles() -> None:
    """Make this process look as if Dynamo never compiled in it (the agent's in-process
    collectors that stand aside once a compile happened are tested after other files, on the
    same xdist worker, compiled in process)."""
    if "torch._dynamo" in sys.modules:
        from torch._dynamo import reset
        from torch._dynamo.utils import counters

        reset()
        counters.clear()
        import gc

        gc.collect()  # compiled modules of earlier tests


def graph_malloc() -> dict[str, float]:
    """tests/scripts/graph_malloc.py's independent measure of total_loss.py's leak a step."""
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "graph_malloc.py")],
                         capture_output=True, text=True, timeout=300)
    if out.returncode == 2:
        pytest.skip("no glibc mallinfo2 here")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))

"""Fake runs of a training script: its first steps under FakeTensorMode, from a process that
never imports torch.

:class:`FakeRunner` starts ``python -m memscope.agent.fake.fakerun`` once (it imports torch and
warms up, a few seconds) and sends it one request per trial; each trial is a fork of that
process, so ``memscope fit``'s dozen trials cost the script's own work each. The figures come
back as a JSON file (:class:`FakeResult`); the script's output goes to a log beside it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import memscope
from memscope.errors import UserError
from memscope.safe_files import replace_new

TRIAL_TIMEOUT = 600.0  # seconds for one fake run (a script that waits for input, say)
START_TIMEOUT = 300.0  # importing torch on a loaded machine


@dataclass
class FakeResult:
    """What one fake run measured (see memscope.agent.fake.fakerun for the producer)."""

    data: dict[str, Any]
    log: str
    args: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.data.get("status") == "ok"

    @property
    def error(self) -> str:
        return str(self.data.get("error") or "")

    @property
    def peak(self) -> int:
        return int(self.data.get("peak_bytes") or 0)

    @property
    def peak_rounded(self) -> int:
        return int(self.data.get("peak_rounded_bytes") or 0)

    @property
    def gpu(self) -> dict[str, Any] | None:
        """The GPU's own peak and breakdown when the script put tensors on one (its CPU tensors
        are host memory), else None: every tensor stayed on the CPU."""
        gpu = (self.data.get("peak_by_device") or {}).get("cuda")
        return gpu if isinstance(gpu, dict) else None

    @property
    def gpu_peak_rounded(self) -> int:
        """What a GPU would hold at its peak (512-byte blocks): the GPU's tensors when the
        script used one, else all of them (a script that moves nothing to a GPU)."""
        gpu = self.gpu
        return int(gpu["peak_rounded_bytes"]) if gpu else self.peak_rounded

    @property
    def gpu_breakdown(self) -> dict[str, int]:
        gpu = self.gpu
        return dict((gpu or {}).get("breakdown") or self.data.get("peak_breakdown") or {})

    @property
    def steps(self) -> list[dict[str, Any]]:
        return list(self.data.get("steps") or [])

    def __getitem__(self, key: str) -> Any:
        return self.data.get(key)


def child_environment() -> dict[str, str]:
    """The user's environment, without memscope's agent variables (a fake run is not recorded),
    with this memscope importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSCOPE_")}
    here = os.path.dirname(os.path.dirname(os.path.abspath(memscope.__file__)))
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and "memscope/agent/runtime/bootstrap" not in p]
    env["PYTHONPATH"] = os.pathsep.join([*parts, here])
    env.setdefault("PYTHONUNBUFFERED", "1")
    # A fake run never touches a real GPU, on a GPU machine too: the GPU it sizes is the pretend
    # one (memscope.agent.fake.fake_cuda), as on every CPU machine. Hidden, the real GPUs cannot
    # be initialised by the server (its forked trials then all failed, "CUDA error:
    # initialization error", seen on an H100 machine), take no memory from a training running
    # on them, and give the same estimate as a CPU machine. NVML answers is_available() without
    # initialising the driver should anything still ask.
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    return env


class FakeRunner:
    """One warm fake-run server; ``run`` for each trial. Use as a context manager."""

    def __init__(self, workdir: str | None = None, timeout: float = TRIAL_TIMEOUT) -> None:
        self.workdir = workdir or tempfile.mkdtemp(prefix="memscope-fake-")
        self.timeout = timeout
        self.proc: subprocess.Popen[str] | None = None
        self.count = 0

    def __enter__(self) -> "FakeRunner":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        # ^C: end the server and the trial it forked now, not after a trial that may run for minutes
        self.close(kill=exc_type is not None and issubclass(exc_type, KeyboardInterrupt))

    def _start(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            log = open(replace_new(os.path.join(self.workdir, "server.log")), "w")
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "memscope.agent.fake.fakerun"], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=log, text=True, env=child_environment(),
                    start_new_session=True)
            except OSError as exc:
                raise UserError(f"cannot start {sys.executable}: {exc.strerror}") from None
            finally:
                log.close()
        return self.proc

    def run(self, script: str, args: Sequence[str], *, steps: int = 2, techniques: Sequence[str] = (),
            checkpoint_blocks: list[str] | str | None = None, dataloader_batch: int | None = None,
            gpu_memory: int | None = None, pretend_cuda: bool = True, cwd: str | None = None,
            sac_save: list[str] | None = None, sac_profile: bool = False) -> FakeResult:
        """One fake run of ``python SCRIPT ARGS``; raises UserError only when memscope itself
        could not run it (a script that fails is a result with ``ok`` False). ``sac_save``:
        selective checkpointing of the repeated blocks, keeping those ops' outputs;
        ``sac_profile``: profile the first block op by op (the result's ``sac_profile``)."""
        self.count += 1
        stem = f"trial-{self.count}"
        req: dict[str, Any] = {"id": self.count, "script": script, "args": list(args), "cwd": cwd or os.getcwd(),
               "result": os.path.join(self.workdir, stem + ".json"),
               "log": os.path.join(self.workdir, stem + ".log"), "steps": steps,
               "techniques": list(techniques), "checkpoint_blocks": checkpoint_blocks,
               "dataloader_batch": dataloader_batch, "gpu_memory": gpu_memory,
               "pretend_cuda": pretend_cuda, "sac_save": sac_save, "sac_profile": sac_profile}
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise UserError(f"the fake-run process ended: {self._server_error()}") from None
        limit = START_TIMEOUT + self.timeout if self.count == 1 else self.timeout
        deadline = time.monotonic() + limit
        line = ""
        while not line:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise UserError(f"the fake run of {script} took more than {limit:.0f} s "
                                f"(log: {req['log']})")
            ready, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
            if ready:
                line = proc.stdout.readline()
                if not line:
                    raise UserError(f"the fake-run process ended: {self._server_error()}")
        try:
            with open(req["result"]) as f:
                data = json.load(f)
        except (OSError, ValueError):
            status = json.loads(line).get("status")
            raise UserError(f"the fake run of {script} died (status {status}) before writing its "
                            f"figures (log: {req['log']})") from None
        return FakeResult(data, req["log"], list(args))

    def _server_error(self) -> str:
        try:
            with open(os.path.join(self.workdir, "server.log"), errors="replace") as f:
                lines = [ln.strip() for ln in f if ln.strip()]
        except OSError:
            lines = []
        return lines[-1] if lines else "no message"

    def close(self, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=0 if kill else 5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the server and a trial it forked
            except OSError:
                pass
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

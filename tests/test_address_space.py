"""Address space (issue #21): a training that fits ``ulimit -v`` plain still fits attached.

Measured on tiny_gpt (20 steps, OMP_NUM_THREADS=1; benchmarks/address_space.py): plain VmPeak
697 MB; attached, memscope's threads were 3 with 8 MiB stacks and a 64 MiB malloc arena each
(+226 MB VmPeak; under a limit it needed ~920 MB where plain needs ~680). Now: 2 threads (the
watchdog is a chore of the sampler) with 2 MiB stacks, +131 to +138 MiB VmPeak, ~820 MB needed. The
limit below, plain's VmPeak + 160 MB, passes today and failed before (the run died at import).
glibc gives each thread that mallocs its own arena, so two threads reserve 128 MiB: the
issue's 64 MB needs one thread, or an arena cap that would change the user's own malloc.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ROOT, SCRIPTS, report_json

MARGIN_MB = 160
STEPS = 20

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")


def _run(args: list[str], probe: Path, limit: int | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", VM_PROBE_OUT=str(probe))

    def cap() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240, preexec_fn=cap)


def _vm_peak(probe: Path) -> int:
    fields = dict(item.split("=") for item in probe.read_text().split())
    return int(fields["VmPeak"]) * 1024


def test_attached_training_fits_plain_address_space_plus_margin(tmp_path: Path) -> None:
    script = [str(SCRIPTS / "vm_probe.py"), str(EXAMPLES / "tiny_gpt.py"), "--steps", str(STEPS)]
    plain = _run(script, tmp_path / "plain.txt")
    assert plain.returncode == 0, plain.stderr
    limit = _vm_peak(tmp_path / "plain.txt") + MARGIN_MB * 2**20

    db = tmp_path / "run.db"
    attached = _run(["-m", "memscope", "attach", "--headless", "--db", str(db), *script],
                    tmp_path / "attached.txt", limit)
    assert attached.returncode == 0, attached.stderr[-2000:]
    run = report_json(db)["run"]
    assert run["steps"] == STEPS and run["status"] == "finished"
    assert _vm_peak(tmp_path / "attached.txt") <= limit

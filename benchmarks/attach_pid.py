"""What ``memscope attach --pid`` costs a training that was started without memscope.

The workload is ``make bench``'s (examples/tiny_gpt.py's model at benchmarks/overhead.py's
DEFAULT_CONFIG), run by plain ``python`` for ``--steps`` steps, timing each of its own steps
(``time.perf_counter`` around the step, in the script: tests/scripts style, no memscope inside).
Three arms, alternated for ``--repeats`` rounds after one untimed warm-up of each:

* plain:     never attached;
* attached:  ``memscope attach --pid`` at its step 5 (default options, --headless), attached to
  the end;
* detached:  attached at step 5, detached after ``--detach-after`` recorded steps (--max-steps).

Printed (ratios against the plain arm of the same round, medians over rounds; nothing asserted):

* time from ``attach --pid`` to the first recorded step (the steps row of step 0 ending) and to
  the agent's first row, seconds;
* overhead while attached: median step time over the steps from 10 after the attach's first step
  to the end, against the plain arm's same steps;
* after detach: median step time over the steps from 5 after the detach to the end, against plain.

    .venv/bin/python benchmarks/attach_pid.py                # ~4 minutes on 2 cores
    .venv/bin/python benchmarks/attach_pid.py --repeats 1 --steps 40   # a smoke test

Run it alone on the machine: any other load makes the ratios meaningless.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from overhead import DEFAULT_CONFIG  # noqa: E402

WORKLOAD = '''
import json, sys, time
sys.path.insert(0, {examples!r})
import torch
import torch.nn.functional as F
from tiny_gpt import TinyGPT
cfg = json.loads(sys.argv[1]); steps = int(sys.argv[2])
torch.manual_seed(0)
model = TinyGPT(256, cfg["d-model"], cfg["heads"], cfg["layers"], cfg["seq"], False)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
times = []
for step in range(steps):
    t = time.perf_counter()
    idx = torch.randint(0, 256, (cfg["batch"], cfg["seq"] + 1))
    loss = F.cross_entropy(model(idx[:, :-1]).reshape(-1, 256), idx[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    times.append(time.perf_counter() - t)
    print("step", step, time.time(), flush=True)
print("TIMES " + json.dumps(times), flush=True)
'''


def _workload(tmp: Path, steps: int, env: dict[str, str]) -> subprocess.Popen[str]:
    script = tmp / "workload.py"
    script.write_text(WORKLOAD.format(examples=str(ROOT / "examples")))
    return subprocess.Popen([sys.executable, str(script), json.dumps(DEFAULT_CONFIG), str(steps)],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _until_step(proc: subprocess.Popen[str], n: int) -> list[str]:
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(f"step {n} "):
            return lines
    raise RuntimeError(f"the workload ended before step {n}")


def _times(proc: subprocess.Popen[str]) -> list[float]:
    out, _ = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the workload failed ({proc.returncode})")
    return json.loads(out.split("TIMES ", 1)[1])


def _first_rows(db: Path) -> tuple[float, float, int]:
    conn = sqlite3.connect(db)
    try:
        attached = conn.execute("SELECT attached FROM processes").fetchone()[0]
        first_end = conn.execute("SELECT min(end) FROM steps").fetchone()[0]
        recorded = conn.execute("SELECT count(*) FROM steps").fetchone()[0]
    finally:
        conn.close()
    return attached, first_end, recorded


def one_round(tmp: Path, steps: int, detach_after: int, env: dict[str, str]) -> dict[str, Any]:
    plain = _workload(tmp, steps, env)
    plain_times = _times(plain)
    out: dict[str, Any] = {"plain": plain_times}
    for arm in ("attached", "detached"):
        db = tmp / f"{arm}.db"
        for p in tmp.glob(f"{arm}.db*"):
            p.unlink()
        proc = _workload(tmp, steps, env)
        _until_step(proc, 5)
        cmd = [sys.executable, "-m", "memscope", "attach", "--pid", str(proc.pid), "--headless", "--db", str(db)]
        if arm == "detached":
            cmd += ["--max-steps", str(detach_after)]
        began = time.time()
        attach = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env=env, cwd=ROOT)
        times = _times(proc)
        attach.communicate(timeout=300)
        attached, first_end, recorded = _first_rows(db)
        out[arm] = {"times": times, "to_agent_s": attached - began, "to_first_step_s": first_end - began,
                    "recorded": recorded, "attach_rc": attach.returncode}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=90)
    p.add_argument("--detach-after", type=int, default=15, help="recorded steps before the detach arm detaches")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)}
    rounds = []
    with tempfile.TemporaryDirectory(prefix="memscope-attach-bench-") as tmp:
        one_round(Path(tmp), min(a.steps, 30), min(a.detach_after, 5), env)  # warm-up, untimed
        for i in range(a.repeats):
            r = one_round(Path(tmp), a.steps, a.detach_after, env)
            rounds.append(r)
            plain = r["plain"]
            att, det = r["attached"], r["detached"]
            # steps of the workload: attach began at its step 5; the first recorded step ends some
            # steps later; compare the steps from 10 after that point, and 5 after the detach
            start = min(len(plain) - 5, 5 + int(att["to_first_step_s"] / statistics.median(plain)) + 10)
            det_from = min(len(plain) - 5, 5 + int(det["to_first_step_s"] / statistics.median(plain))
                           + a.detach_after + 5)
            r["attached_ratio"] = statistics.median(att["times"][start:]) / statistics.median(plain[start:])
            r["detached_ratio"] = statistics.median(det["times"][det_from:]) / statistics.median(plain[det_from:])
            print(f"round {i + 1}: plain step {statistics.median(plain) * 1000:.0f} ms; attach -> agent "
                  f"{att['to_agent_s']:.2f} s, -> first recorded step {att['to_first_step_s']:.2f} s; "
                  f"attached steps {start}.. {r['attached_ratio']:.3f}x; after detach steps {det_from}.. "
                  f"{r['detached_ratio']:.3f}x ({det['recorded']} recorded)", flush=True)
    med = statistics.median
    print(f"median over {a.repeats} rounds: attach -> agent {med(r['attached']['to_agent_s'] for r in rounds):.2f} s, "
          f"-> first recorded step {med(r['attached']['to_first_step_s'] for r in rounds):.2f} s; "
          f"while attached {med(r['attached_ratio'] for r in rounds):.3f}x plain; "
          f"after detach {med(r['detached_ratio'] for r in rounds):.3f}x plain")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How close the fake estimate is to the real peak: the accuracy table of docs/plan.md.

For each model x optimizer x precision, the script runs twice:

* ``memscope estimate``'s fake run (memscope.runners.fake_estimate): its exact live-tensor
  peak, nothing allocated;
* a real run on CPU under the agent with whatif's exact counter (the ``tensor_peak`` option:
  every live tensor storage, per step, from step 1), as ``memscope whatif`` measures.

bf16 is the model's forward under ``torch.autocast("cpu", dtype=torch.bfloat16)`` and SGD on
tiny_gpt is ``torch.optim.SGD(momentum=0.9)`` in place of its AdamW, both applied by the agent's
techniques (``memscope attach --try mixed_precision / lighter_optimizer``) to the real run and
the fake run alike; the other models take ``--optimizer`` themselves.

    .venv/bin/python benchmarks/estimate_accuracy.py             # the whole table (markdown)
    .venv/bin/python benchmarks/estimate_accuracy.py --quick     # one case per model
    .venv/bin/python benchmarks/estimate_accuracy.py --json

Exits 1 when a case is further off than its measured precision (``allowed``: to the byte, bar the
ResNet under bf16 autocast, 0.003%) or a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memscope.runners.fake_estimate import FakeRunner  # noqa: E402
from memscope.runners.script_estimate import run_recorded  # noqa: E402
from memscope.store.reader import RunReader  # noqa: E402
from memscope.units import human_bytes  # noqa: E402

EX = ROOT / "examples"
# The measured precision, asserted by tests/test_fake_estimate.py: to the byte, bar the ResNet
# under bf16 autocast, whose fake run is 1,152 B (0.0026%) below the real one (some bf16
# convolution's real CPU output has a larger storage than its fake one; not traced further).
SLACK = {("CNN (ResNet)", "bf16 autocast"): 3e-5}  # |relative error| at most


def allowed(model: str, precision: str) -> float:
    """The largest |relative error| this case may show."""
    return SLACK.get((model, precision), 0.0)


# model: (script and arguments, {optimizer: (extra arguments, techniques)})
MODELS: dict[str, tuple[list[str], dict[str, tuple[list[str], list[str]]]]] = {
    "tiny_gpt": ([str(EX / "tiny_gpt.py"), "--eval-every", "0"],
                 {"Adam": ([], []), "SGD": ([], ["lighter_optimizer"])}),
    "nanoGPT (10.7M)": ([str(EX / "scenarios" / "nanogpt.py"), "--batch-size", "2"],
                        {"Adam": (["--optimizer", "adamw"], []), "SGD": (["--optimizer", "sgd"], [])}),
    "CNN (ResNet)": ([str(EX / "scenarios" / "resnet.py")],
                     {"Adam": (["--optimizer", "adam"], []), "SGD": (["--optimizer", "sgd"], [])}),
    "MLP": ([str(EX / "scenarios" / "mlp.py"), "--depth", "6", "--width", "512", "--batch", "512"],
            {"Adam": (["--optimizer", "adam"], []), "SGD": (["--optimizer", "sgd"], [])}),
}
PRECISIONS = {"fp32": [], "bf16 autocast": ["mixed_precision"]}
QUICK = [("tiny_gpt", "Adam", "fp32"), ("nanoGPT (10.7M)", "SGD", "bf16 autocast"),
         ("CNN (ResNet)", "Adam", "bf16 autocast"), ("MLP", "SGD", "fp32")]


@dataclass
class Row:
    model: str
    optimizer: str
    precision: str
    estimate: int | None
    measured: int | None
    error: float | None
    fake_s: float
    note: str = ""


def cases(quick: bool = False) -> list[tuple[str, str, str]]:
    if quick:
        return list(QUICK)
    return [(m, o, p) for m in MODELS for o in MODELS[m][1] for p in PRECISIONS]


def command(model: str, optimizer: str, precision: str) -> tuple[list[str], list[str]]:
    base, optimizers = MODELS[model]
    extra, tries = optimizers[optimizer]
    return [*base, *extra], [*tries, *PRECISIONS[precision]]


def measure(runner: FakeRunner, model: str, optimizer: str, precision: str, workdir: str) -> Row:
    cmd, tries = command(model, optimizer, precision)
    script, args = cmd[0], cmd[1:]
    t0 = time.perf_counter()
    fake = runner.run(script, args, steps=2, techniques=tries)
    fake_s = time.perf_counter() - t0
    estimate = fake.peak if fake.ok else None
    db = os.path.join(workdir, f"real-{len(os.listdir(workdir))}.db")
    real = run_recorded(script, args, db, {"max_steps": 3, "layers_every": 0, "inventory_every": 0,
                                           "tensor_peak": True, "try_techniques": tries})
    measured = None
    note = "" if fake.ok else f"fake run: {fake.error}"
    if real.ok:
        with RunReader(db) as reader:
            peaks = [int(e["data"]["peak_bytes"]) for e in reader.events("tensor_peak")
                     if isinstance(e["data"], dict) and e["data"].get("peak_bytes") is not None]
        measured = max(peaks) if peaks else None
    else:
        note = f"real run: {real.last_error()}"
    error = (estimate - measured) / measured if estimate is not None and measured else None
    return Row(model, optimizer, precision, estimate, measured, error, round(fake_s, 2), note)


def markdown(rows: list[Row]) -> str:
    lines = ["| model | optimizer | precision | estimate (fake run) | measured (real run) | error |",
             "|---|---|---|---:|---:|---:|"]
    for r in rows:
        err = f"{r.error * 100:+.3f}%" if r.error is not None else r.note or "-"
        lines.append(f"| {r.model} | {r.optimizer} | {r.precision} | {human_bytes(r.estimate)} | "
                     f"{human_bytes(r.measured)} | {err} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one case per model")
    p.add_argument("--json", action="store_true", help="rows as JSON instead of the markdown table")
    args = p.parse_args()
    workdir = tempfile.mkdtemp(prefix="memscope-accuracy-")
    rows = []
    os.makedirs(os.path.join(workdir, "fake"))
    with FakeRunner(os.path.join(workdir, "fake")) as runner:
        for case in cases(args.quick):
            rows.append(measure(runner, *case, workdir=workdir))
            print(f"{' / '.join(case)}: {rows[-1].error}", file=sys.stderr)
    print(json.dumps([asdict(r) for r in rows], indent=2) if args.json else markdown(rows))
    bad = [r for r in rows if r.error is None or abs(r.error) > allowed(r.model, r.precision)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

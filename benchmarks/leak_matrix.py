"""The leak matrix of issue #20, printed: each leak example and each leak injected into a tiny GPT,
run once at DEFAULT options under ``memscope attach``, and the verdict a run ending at each
inventory would get (the agent cannot know the run's length). Printed per case: the first step
reported (with its holder), the last inventory and whether the leak was still reported there, the
verdict at 20, 60, 200, 1,000 and 5,000 steps, the holder and storing line at the end, and the
rate per step against tests/leaktruth/truth.py's count without memscope.

The cases, their expected holders and lines, and the truth are tests/leak_lengths.py's (the tests
in tests/test_leak_lengths*.py assert them; this prints them).

    .venv/bin/python benchmarks/leak_matrix.py                      # every case (~5 minutes)
    .venv/bin/python benchmarks/leak_matrix.py detached_list gpt_eval
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from leak_lengths import CASES, LENGTHS, Run, attach, reported, truth  # noqa: E402


def _mib(n: float) -> str:
    return f"{n / 1024:.1f} KiB" if abs(n) < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


def _cell(run: Run, n: int, first: int | None) -> str:
    """The verdict of the run had it ended after n steps: yes, NO (missed once reported), - (not yet)."""
    if reported(run, n - 1):
        return "yes"
    return "-" if first is None or n - 1 < first else "NO"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help=f"a subset of: {', '.join(CASES)}")
    args = ap.parse_args()
    names = args.cases or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"leak_matrix: unknown case {unknown[0]!r}", file=sys.stderr)
        return 2
    failed = 0
    with tempfile.TemporaryDirectory(prefix="leak-matrix-") as tmp:
        for name in names:
            case = CASES[name]
            where = Path(tmp) / name
            where.mkdir()
            run = attach(case, where / "run.db", case.steps)
            steps = run.inventory_steps
            lengths = [n for n in (*LENGTHS, 5000) if n <= case.steps]
            if case.held_by is None:
                wrong = [s for s in steps if s >= 20 and run.leaks_at(s)]
                cells = " ".join(f"{n}:{'-' if not run.leaks_at(n - 1) else 'LEAK'}" for n in lengths)
                verdict = "clean" if not wrong else f"FALSE LEAK at steps {wrong[:5]}"
                failed += bool(wrong)
                print(f"{name:17} {case.steps:5} steps, {len(steps):3} inventories (last at {steps[-1]}): "
                      f"{verdict}   {cells}")
                continue
            verdicts = {s: reported(run, s) for s in steps}
            hits = [s for s in steps if verdicts[s] is not None]
            first = hits[0] if hits else None
            withdrawn = [s for s in steps if first is not None and s >= first and verdicts[s] is None]
            cells = " ".join(f"{n}:{_cell(run, n, first)}" for n in lengths)
            end = verdicts[steps[-1]]
            t = truth(case, where)
            line = (f"{name:17} {case.steps:5} steps, {len(steps):3} inventories (last at {steps[-1]}): "
                    f"first reported at step {first}, last at {hits[-1] if hits else None}"
                    f"{'' if not withdrawn else f', WITHDRAWN at {withdrawn[:5]}'}   {cells}")
            print(line)
            if end is not None:
                nodes = end.graph_nodes_per_step
                # tensor bytes: the rate less what its graph nodes cost (the truth counts tensors)
                rate = end.bytes_per_step - nodes * end.node_cost.bytes
                err = (rate - t["bytes"]) / t["bytes"] if t["bytes"] > 64 else None
                nerr = (nodes - t["nodes"]) / t["nodes"] if t["nodes"] >= 1 else None
                print(f"{'':17} held by {end.held_by}, stored at {end.site} (made at {end.created_at}); "
                      f"tensors {_mib(rate)}/step" + (f" ({err:+.2%} against the truth)" if err is not None else "")
                      + f", {nodes:.1f} graph nodes/step" + (f" ({nerr:+.2%})" if nerr is not None else "")
                      + (f" at {end.node_cost.bytes:.0f} B each"
                         f" ({'measured' if end.node_cost.measured else 'estimate'})" if nodes else ""))
            failed += first is None or bool(withdrawn) or end is None
    print(f"{len(names)} cases, {failed} with a missed, withdrawn or false verdict")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The runs behind tests/test_leak_lengths.py (the leak examples) and
tests/test_leak_lengths_gpt.py (leaks injected into a tiny GPT): two files so make test's two
workers run them side by side. Leak verdicts at DEFAULT options hold for the whole run: every
leak example and the leaks injected into a tiny GPT trained the way karpathy's makemore / minGPT
/ ng-video-lecture train (tests/scripts/leaky_gpt.py) run once under ``memscope attach`` for
1,000 steps (400 for the GPT), and the verdict is taken as a run ending at each inventory would
get it (the agent cannot know how long a run will be: a run's first N steps are an N-step run).
Checked at 20, 60, 200 and 1,000 steps and at every inventory in between: the leak, once
reported, stays reported with its holder and the line that stored it, at the rate
tests/leaktruth/truth.py measures without memscope (within 0.5%; 30% for a leak that grows only
at evaluations); the clean runs report nothing. detached_list runs 5,000 steps (its first 1,000
are the 1,000-step run: the agent cannot know the run's length), checked at the same lengths and
at 5,000.
"""

from __future__ import annotations

import fcntl
import json
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLES, ROOT, SCRIPTS, graph_malloc, memscope, report_json
from memscope.analysis.leaks import Leak, find_leaks
from shared_runs import shared_dir

LEAKS = EXAMPLES / "leaks"
GPT = SCRIPTS / "leaky_gpt.py"


@dataclass
class Case:
    script: Path
    args: list[str]
    held_by: str | None  # None: a clean run
    site: str | None = None  # the line that stored it (file:line, relative to the repo)
    steps: int = 1000
    truth_steps: tuple[int, int] = (10, 30)
    first_by: int = 8  # reported (with holder) by this step
    # bytes and nodes per step against the truth: counts agree exactly on every leak that grows
    # every step (measured: 0.3% on the nodes of 155 kept GPT graphs, sampled), so a 1% error fails; a leak that grows
    # every 30 steps has a rate that depends on where the run ends between two evaluations
    tolerance: float = 0.005
    extra: list[str] = field(default_factory=list)


def _line(path: Path, text: str) -> str:
    lines = path.read_text().splitlines()
    (n,) = [i + 1 for i, line in enumerate(lines) if line.strip().startswith(text)]
    return f"{path.relative_to(ROOT)}:{n}"


CASES: dict[str, Case] = {
    "leaky": Case(EXAMPLES / "leaky.py", ["--width", "64", "--batch", "16"], "__main__.loss_history",
                  _line(EXAMPLES / "leaky.py", "loss_history.append(loss)")),
    "detached_list": Case(LEAKS / "detached_list.py", [], "__main__.features",
                          _line(LEAKS / "detached_list.py", "features.append("), steps=5000),
    "hook_cache": Case(LEAKS / "hook_cache.py", [], "__main__.model.2.cache",
                       _line(LEAKS / "hook_cache.py", "module.cache.append(")),
    "class_cache": Case(LEAKS / "class_cache.py", [], "__main__.EmbeddingCache.store",
                        _line(LEAKS / "class_cache.py", "EmbeddingCache.store[key] =")),
    "local_list": Case(LEAKS / "local_list.py", [], "__main__.train.<locals>.history",
                       _line(LEAKS / "local_list.py", "history.append(")),
    "total_loss": Case(LEAKS / "total_loss.py", [], "__main__.train.<locals>.total_loss",
                       _line(LEAKS / "total_loss.py", "total_loss += loss  # the leak")),
    "gpt_cache": Case(GPT, ["--leak", "cache"], "__main__.Trainer.run.<locals>.cache",
                      _line(GPT, "cache[it] = logits"), steps=400),
    "gpt_history": Case(GPT, ["--leak", "history"], "__main__.Trainer.run.<locals>.history",
                        _line(GPT, "history.append(self.loss)"), steps=400),
    "gpt_callback": Case(GPT, ["--leak", "callback"], "__main__.kept_losses",
                         _line(GPT, "kept_losses.append(trainer.loss)"), steps=400),
    # kept every 30 steps: the site is found by a capture retried with a longer window
    "gpt_eval": Case(GPT, ["--leak", "eval"], "__main__.eval_outputs",
                     _line(GPT, "eval_outputs.append(logits)"), steps=400,
                     truth_steps=(10, 70), first_by=95, tolerance=0.3),
    "gpt_total": Case(GPT, ["--leak", "total"], "__main__.Trainer.run.<locals>.total_loss",
                      _line(GPT, "total_loss += self.loss"), steps=400),
    "healthy": Case(LEAKS / "healthy.py", [], None),
    "healthy_patterns": Case(LEAKS / "healthy_patterns.py", [], None, steps=400),
    "gpt_clean": Case(GPT, ["--leak", "none"], None, steps=400),
}
LENGTHS = (20, 60, 200, 1000)
# the two halves, about equal in time: the leak examples (1,000 and 5,000 steps) and the 400-step runs
EXAMPLE_CASES = sorted(name for name, case in CASES.items() if case.script != GPT and case.steps != 400)
GPT_CASES = sorted(set(CASES) - set(EXAMPLE_CASES))


@dataclass
class Run:
    case: Case
    db: Path
    inventory_steps: list[int]
    rows: list[dict[str, Any]]
    holders: list[dict[str, Any]]

    def leaks_at(self, last: int) -> list[Leak]:
        """The verdict of a run that ended after step ``last``."""
        return find_leaks([s for s in self.inventory_steps if s <= last],
                          [r for r in self.rows if r["step"] <= last],
                          [h for h in self.holders if h["step"] <= last])


def attach(case: Case, db: Path, steps: int) -> Run:
    out = memscope("attach", "--headless", "--db", str(db), str(case.script), *case.args, "--steps", str(steps),
                   timeout=600)
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        inv = [r[0] for r in conn.execute("SELECT step FROM inventories ORDER BY step")]
        rows = [dict(r) for r in conn.execute("SELECT * FROM inventory_groups")]
        holders = [dict(r) for r in conn.execute("SELECT * FROM leak_holders ORDER BY step")]
    return Run(case, db, inv, rows, holders)


TRUTH = ROOT / "tests" / "leaktruth" / "truth.py"


def _job(case: Case, out: Path) -> list[Any]:
    a, b = case.truth_steps
    return [str(out), a, b, str(case.script), [*case.args, "--steps", str(b + 2)]]


def _per_step(case: Case, out: Path) -> dict[str, float]:
    a, b = case.truth_steps
    groups = json.loads(out.read_text())["groups"]
    delta = [sum(g[1][i] - g[0][i] for g in groups.values()) / (b - a) for i in range(4)]
    return {"bytes": delta[1] + delta[3], "nodes": delta[2]}


def truth(case: Case, tmp: Path) -> dict[str, float]:
    """Bytes (tensors and what their graphs save) and autograd nodes kept per step, measured by a
    plain run of the script with a gc walk at two optimizer steps (no memscope)."""
    out = tmp / "truth.json"
    job = _job(case, out)
    proc = subprocess.run([sys.executable, str(TRUTH), *map(str, job[:4]), *job[4]],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return _per_step(case, out)


_TRUTHS: dict[str, dict[str, float]] = {}


def truth_of(name: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """:func:`truth` of case ``name``, measured with those of every other leak of its file's half
    (EXAMPLE_CASES or GPT_CASES) in one process (truth.py --many: one interpreter and torch
    start-up instead of one a case: 7.8 s for the 11 leaks, 35.9 s one process each) and kept
    for the module."""
    if name not in _TRUTHS:
        half = EXAMPLE_CASES if name in EXAMPLE_CASES else GPT_CASES
        names = [n for n in half if CASES[n].held_by is not None]
        tmp = tmp_path_factory.mktemp("truth")
        jobs = [_job(CASES[n], tmp / f"{n}.json") for n in names]
        (tmp / "jobs.json").write_text(json.dumps(jobs))
        proc = subprocess.run([sys.executable, str(TRUTH), "--many", str(tmp / "jobs.json")],
                              capture_output=True, text=True, cwd=ROOT, timeout=600)
        assert proc.returncode == 0, proc.stderr
        _TRUTHS.update({n: _per_step(CASES[n], tmp / f"{n}.json") for n in names})
    return _TRUTHS[name]


def shared_graph_malloc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """:func:`conftest.graph_malloc` (total_loss.py's loop without memscope, glibc's count),
    measured once per session for both xdist workers: this file and tests/test_leaks.py compare
    their total_loss runs with the same measurement (a lock in tests/shared_runs.py's directory)."""
    where = shared_dir(tmp_path_factory)
    result = where / "graph_malloc.json"
    with open(where / "graph_malloc.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker measuring it: wait for it
        if not result.exists():
            part = result.with_suffix(".part")
            part.write_text(json.dumps(graph_malloc()))  # skips (nothing written) without mallinfo2
            part.replace(result)
        return dict(json.loads(result.read_text()))


_RUNS: dict[str, Run] = {}


def run_of(name: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One attach per case for the whole module (detached_list's is read by two tests)."""
    if name not in _RUNS:
        case = CASES[name]
        _RUNS[name] = attach(case, tmp_path_factory.mktemp(name) / "run.db", case.steps)
    return _RUNS[name]


def reported(run: Run, last: int) -> Leak | None:
    found = [lk for lk in run.leaks_at(last) if lk.held_by == run.case.held_by]
    return found[0] if found else None


def check_verdicts(run: Run, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """What each case asserts (the module doc): the verdict at every length, the rate against the
    truth, and the report at the end."""
    case = run.case
    if case.held_by is None:
        # a bounded buffer's first fill looks like a leak until it stops (deque(maxlen=5), a
        # 10-entry warm-up list, a 16-step epoch buffer): from step 20 on, nothing, ever
        wrong = {s: [(lk.shape, lk.held_by) for lk in run.leaks_at(s)] for s in run.inventory_steps if s >= 20}
        wrong = {s: v for s, v in wrong.items() if v}
        assert wrong == {}, f"a clean run reported leaks at steps {sorted(wrong)[:8]}: {list(wrong.values())[:2]}"
        assert report_json(run.db)["leaks"] == []
        return
    steps = run.inventory_steps
    verdicts = {s: reported(run, s) for s in steps}
    first = next(s for s in steps if verdicts[s] is not None)
    assert first <= case.first_by, first
    withdrawn = [s for s in steps if s >= first and verdicts[s] is None]
    assert withdrawn == [], f"reported at step {first}, withdrawn at steps {withdrawn[:8]}"
    t = truth_of(next(n for n, c in CASES.items() if c is case), tmp_path_factory)
    for length in [n for n in LENGTHS if n <= case.steps] + [case.steps]:
        lk = run.leaks_at(length - 1)
        mine = [x for x in lk if x.held_by == case.held_by]
        if length - 1 < first:
            continue
        assert len(mine) == 1, (length, lk)
        leak = mine[0]
        if case.site is not None:
            assert leak.site == case.site, (length, leak.site, leak.created_at)
        nodes = leak.graph_nodes_per_step
        tensor_bytes = leak.bytes_per_step - nodes * leak.node_cost.bytes
        if t["bytes"] > 64:  # a tensor leak: its bytes (what its nodes cost is checked below)
            assert abs(tensor_bytes - t["bytes"]) <= case.tolerance * t["bytes"], (length, tensor_bytes, t)
        if t["nodes"] >= 1:
            # nodes: the parameters' AccumulateGrad nodes, shared by every graph, are not a
            # step's (not counted: they moved between the live loss and the kept graphs, 2.04%
            # off at 60 steps under load). A big group's nodes are extrapolated from a sample of
            # its graphs (scan.GRAPH_SAMPLE): 0.52% off at 200 steps under load, hence 2%
            assert abs(nodes - t["nodes"]) <= max(case.tolerance, 0.02) * t["nodes"], (length, nodes, t)
    # the report at the end says the same
    report = report_json(run.db)
    assert [lk["held_by"] for lk in report["leaks"]] == [case.held_by], report["leaks"]
    assert report["leak_check"]["verdict"] == "ok"
    if case.script.name == "total_loss.py":
        # a graph-node leak's bytes: what its nodes cost on this run (heap growth over node
        # growth), against glibc's own count on the same loop without memscope: 1.4-2.4% above
        # here (idle and loaded), 6.0% below in one CI run whose inventories the 1% budget
        # stopped at step 459 (2,354 nodes in the window); the estimate of 800 bytes a node is
        # 12.7% above, so 8% still tells a measurement from the estimate
        (lk,) = report["leaks"]
        heap = shared_graph_malloc(tmp_path_factory)["bytes_per_step"]
        assert lk["node_bytes_measured"] is True and abs(lk["bytes_per_step"] - heap) <= 0.08 * heap, (lk, heap)

"""Leaks as real code makes them (tests/scripts/real_leaks.py), at DEFAULT options: an exception
kept with its traceback, an unbounded ``functools.lru_cache``, a queue fed faster than its
consumer thread drains it, a generator's frame, another thread's running function, a list of
sparse tensors, hooks registered every step; and their clean counterparts. Each is checked as a run ending at 20, 200
and 2,000 steps would be (a run's first N steps are an N-step run: one run of 2,000 steps, all the
linear leaks in one loop, each with tensors of its own shape): the holder, the line that stored
it, and the bytes per step against tests/leaktruth/truth.py's count without memscope; once
reported, never withdrawn. Hooks registered every step make a leak that accelerates (200 steps:
2,000 would run 2 million hook calls): the hooks are counted, their registering line found, the
acceleration said with its cause. ``leaks --diff`` and ``whatif --try fix_leak`` patch each
class, and the patched copy runs without it. Sparse tensors are counted by their indices and
values, in groups of their own layout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, SCRIPTS, cli, memscope, report_json
from leak_lengths import TRUTH, Case, Run, _line, attach
from memscope.analysis.leaks import Leak

SCRIPT = SCRIPTS / "real_leaks.py"
LINEAR = "traceback,cache,queue,generator,thread,sparse"
STEPS = 2000
LENGTHS = (20, 200, 2000)
TOLERANCE = 0.005  # bytes per step against the truth (they agree to the byte on every class)

# class -> (the shapes of its groups, the holder (a prefix where the search may name either of two
# equal paths), the line that stored it, the truth's groups: "shape|dtype|grad_fn" prefixes)
CLASSES: dict[str, tuple[list[list[int]], str, str, tuple[str, ...]]] = {
    "traceback": ([[8, 16]], "__main__.errors[*].__traceback__.<frame ", _line(SCRIPT, "errors.append(e)"),
                  ("[8, 16]|", "[]|float64")),
    "cache": ([[5, 16]], "__main__.position_table<lru_cache maxsize=None, ", _line(SCRIPT, "position_table(step)"),
              ("[5, 16]|",)),
    "queue": ([[6, 16]], "__main__.log_queue.queue", _line(SCRIPT, "log_queue.put("), ("[6, 16]|",)),
    "generator": ([[7, 16]], "__main__.feed.<generator windows>.kept", _line(SCRIPT, "kept.append(t)"),
                  ("[7, 16]|",)),
    "thread": ([[9, 16]], "__main__.owner.<locals>.mine (in thread 'owner')", _line(SCRIPT, "handed.append("),
               ("[9, 16]|",)),
    # a sparse COO tensor a step (its indices and values), beside a sparse model (an embedding's
    # sparse gradients, a sparse adjacency) that keeps nothing
    "sparse": ([[16, 16]], "__main__.sparse_step.__defaults__[0]", _line(SCRIPT, "kept.append(s)"), ("[16, 16]|",)),
}


@pytest.fixture(scope="module")
def linear(tmp_path_factory: pytest.TempPathFactory) -> Run:
    case = Case(SCRIPT, ["--leak", LINEAR], "", steps=STEPS)
    return attach(case, tmp_path_factory.mktemp("linear") / "run.db", STEPS)


@pytest.fixture(scope="module")
def truth(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    """Per truth group, (tensors, bytes, nodes, saved bytes) kept per step between steps 10 and
    30 of a plain run (no memscope)."""
    out = tmp_path_factory.mktemp("truth") / "truth.json"
    proc = subprocess.run([sys.executable, str(TRUTH), str(out), "10", "30", str(SCRIPT), "--leak", LINEAR,
                           "--steps", "32"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    groups = json.loads(out.read_text())["groups"]
    return {k: [(b - a) / 20 for a, b in zip(*v)] for k, v in groups.items()}


def _mine(leaks: list[Leak], name: str) -> list[Leak]:
    shapes = CLASSES[name][0]
    sparse = name == "sparse"
    return [lk for lk in leaks if lk.shape in shapes and (lk.dtype == "float32 sparse_coo") == sparse]


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_each_class_at_every_length(linear: Run, truth: dict[str, list[float]], name: str) -> None:
    _, held_by, site, keys = CLASSES[name]
    steps = linear.inventory_steps
    verdicts = {s: _mine(linear.leaks_at(s), name) for s in steps}
    first = next(s for s in steps if verdicts[s])
    assert first <= 8, first
    withdrawn = [s for s in steps if s >= first and not verdicts[s]]
    assert withdrawn == [], f"reported at step {first}, withdrawn at steps {withdrawn[:8]}"
    want = sum(v[1] + v[3] for k, v in truth.items() if k.startswith(keys))
    nodes = sum(v[2] for k, v in truth.items() if k.startswith(keys))
    for length in LENGTHS:
        got = _mine(linear.leaks_at(length - 1), name)
        assert got, (length, name)
        for lk in got:
            assert lk.held_by is not None and lk.held_by.startswith(held_by), (length, lk.held_by)
            assert lk.site == site, (length, lk.site, lk.created_at)
        # the bytes its tensors and their graphs keep (what the graphs' nodes cost apart)
        tensor_bytes = sum(lk.bytes_per_step - lk.graph_nodes_per_step * lk.node_cost.bytes for lk in got)
        # the queue grows by one item every two steps: the count at an inventory is on the trend
        # or half an item above it, so a rate between two inventories may be off by half an item
        # over the steps between them (193 B/step against 192 at 200 steps, by which steps the
        # allowance let inventories take); every other class grows at every step
        parity = (6 * 16 * 4 / 2) / (length - 1 - first) if name == "queue" else 0.0
        assert abs(tensor_bytes - want) <= TOLERANCE * want + parity, (length, tensor_bytes, want)
        assert abs(sum(lk.graph_nodes_per_step for lk in got) - nodes) <= 0.02 * max(nodes, 1), (length, got)


def test_the_report_names_each_fix(linear: Run) -> None:
    report = report_json(linear.db)
    how = {lk["held_by"]: s["how"] for lk in report["leaks"] for s in report["suggestions"]
           if s["technique"] == "fix_leak" and lk["held_by"] and lk["held_by"] in s["evidence"]}
    tb = [h for k, h in how.items() if ".__traceback__" in k]
    assert tb and all("e.with_traceback(None)" in h and "str(e)" in h for h in tb)
    (cache,) = [h for k, h in how.items() if "<lru_cache" in k]
    assert "lru_cache(maxsize=N)" in cache
    (q,) = [h for k, h in how.items() if k.endswith(".queue")]
    assert "queue.Queue(maxsize=N)" in q and "back-pressure" in q
    assert report["hook_growth"] == []
    (sparse,) = [lk for lk in report["leaks"] if lk["layout"] == "sparse_coo"]
    assert (sparse["dtype"], sparse["shape"]) == ("float32", [16, 16])
    assert {lk["layout"] for lk in report["leaks"]} == {"strided", "sparse_coo"}


@pytest.fixture(scope="module")
def hooks(tmp_path_factory: pytest.TempPathFactory) -> Run:
    case = Case(SCRIPT, ["--leak", "hooks"], "", steps=200)
    return attach(case, tmp_path_factory.mktemp("hooks") / "run.db", 200)


def test_hooks_every_step_are_the_cause_of_an_accelerating_leak(hooks: Run) -> None:
    report = report_json(hooks.db)
    (h,) = report["hook_growth"]
    register = _line(SCRIPT, "model[1].register_forward_hook(stash)  # one more")
    last = hooks.inventory_steps[-1]  # one hook registered at each step before its end
    assert (h["module"], h["kind"], h["hooks_per_step"], h["hooks"]) == ("1", "forward", 1.0, last + 1)
    assert h["site"] == register and h["first_step"] <= 3
    (lk,) = report["leaks"]
    assert lk["held_by"] == "__main__.model.1.seen" and lk["accelerating"] is True
    assert lk["bytes_per_step_now"] > 2 * 512 * (lk["last_step"] - lk["first_step"]) / 4  # ~N hooks, 512 B each
    assert lk["cause"].startswith(f"forward hooks on 1 grow by 1 a step ({last + 1} now, registered at {register}")
    text = cli("leaks", str(hooks.db)).stdout
    assert "accelerating (+" in text and "why it accelerates: forward hooks on 1" in text
    assert f"HOOKS forward hooks on 1: +1/step ({last + 1} now), steps" in text


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Every class's clean counterpart in one loop: the message kept, a bounded cache, a queue
    drained in time, a hook registered once, the generator's and the thread's lists bounded, an
    evaluation under torch.no_grad() every 10 steps."""
    case = Case(SCRIPT, ["--leak", LINEAR + ",hooks", "--clean"], None, steps=STEPS)
    return attach(case, tmp_path_factory.mktemp("clean") / "run.db", STEPS)


def test_clean_counterparts_report_nothing(clean: Run) -> None:
    wrong = {s: [(lk.shape, lk.held_by) for lk in clean.leaks_at(s)] for s in clean.inventory_steps if s >= 20}
    assert {s: v for s, v in wrong.items() if v} == {}
    report = report_json(clean.db)
    assert report["leaks"] == [] and report["hook_growth"] == [] and report["leak_check"]["verdict"] == "ok"
    # the hook registered once was counted (its count stayed 1)
    counts = [e["data"]["counts"] for e in _events(clean.db, "hooks")]
    assert counts and all(c == {"1|forward": 1} for c in counts[1:]), counts[:3]


def _events(db: Path, kind: str) -> list[dict[str, Any]]:
    from memscope.store.reader import RunReader

    with RunReader(str(db)) as reader:
        return reader.events(kind)


def test_diff_patches_each_class(linear: Run, hooks: Run) -> None:
    text = cli("leaks", str(linear.db), "--diff").stdout
    pad = " " * 20
    assert f"-{pad}errors.append(e)\n+{pad}errors.append(e.with_traceback(None))\n" in text
    assert "-@functools.lru_cache(maxsize=None)\n+@functools.lru_cache(maxsize=128)\n" in text
    assert "-log_queue = queue.Queue()\n+log_queue = queue.Queue(maxsize=8)\n" in text
    assert text.count("\n--- a/tests/scripts/real_leaks.py") == 3  # the traceback's two groups: one patch
    text = cli("leaks", str(hooks.db), "--diff").stdout
    assert ("+    if hook_every_step:\n"
            "+        stash_handle = model[1].register_forward_hook(stash)  # one more each step\n"
            "     for step in range(steps):\n"
            "-        if hook_every_step:\n"
            "-            model[1].register_forward_hook(stash)" in text), text


def test_whatif_fix_leak_patches_and_reruns_each_class(tmp_path: Path) -> None:
    """The patches applied to a copy, rerun for 56 steps (the script's own ``--steps`` too: its
    default is 40): every patched leak and the hooks' growth are gone. The bounded queue fills by
    step 14, then holds 7 or 8 items at a step's end as the logger thread is scheduled; a first 8
    long after it filled (a loaded machine's scheduling) once made it a leak in CI
    (test_leak_verdict_series' test_a_real_queue_at_its_bound)."""
    out = memscope("whatif", "--try", "fix_leak", "--steps", "56", "--db-dir", str(tmp_path), "--json", str(SCRIPT),
                   "--leak", "traceback,cache,queue,hooks", "--steps", "56", timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)["fix_leak"]
    patched = {p["held_by"].split("<")[0].split("[")[0]: p for p in doc["patches"] if p["patched"]}
    assert set(patched) == {"__main__.errors", "__main__.position_table", "__main__.log_queue.queue"}, doc
    assert all(p["gone"] for p in patched.values()), doc["patches"]
    (h,) = doc["hook_patches"]
    assert h["patched"] and h["gone"] and h["new"].endswith("stash_handle = model[1].register_forward_hook(stash)"
                                                            "  # one more each step")
    # the stash itself (a list of detached copies, no graph) is the program's choice: not patched
    (kept,) = [p for p in doc["patches"] if not p["patched"]]
    assert kept["held_by"] == "__main__.model.1.seen" and "no autograd graph" in kept["why"]


def test_the_peak_breakdown_counts_the_leaked_tensors(linear: Run, clean: Run) -> None:
    """``peak.breakdown.leaked``: what the leaking groups held at the inventory nearest the peak
    (here they grow from step 0, so their rates times the step, give or take the first steps),
    taken out of ``other``; 0 in a clean run."""
    report = report_json(linear.db)
    bd, step = report["peak"]["breakdown"], report["peak"]["step"]
    near = min(linear.inventory_steps, key=lambda s: (abs(s - step), s))
    per_step = sum(lk["bytes_per_step"] for lk in report["leaks"])
    assert abs(bd["leaked"] - per_step * near) <= 0.05 * per_step * near + 8192, (bd, near, per_step)
    assert list(bd)[-2:] == ["leaked", "other"]
    assert report_json(clean.db)["peak"]["breakdown"]["leaked"] == 0


SOMETIMES = 600  # steps of the run whose leak occurs on some steps only


@pytest.fixture(scope="module")
def sometimes(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """pytorch/examples' vae as issue 36 found it: a check on the output and the hidden layer
    raises on the steps the data decides (about a third), the loop keeps the exception."""
    case = Case(SCRIPT, ["--leak", "sometimes"], "", steps=SOMETIMES)
    return attach(case, tmp_path_factory.mktemp("sometimes") / "run.db", SOMETIMES)


def _first_rise(steps: list[int], walks: list[list[int]]) -> int | None:
    """The walk before the first one where a group grew (bytes and saved bytes), among the
    walks of consecutive steps."""
    for i in range(1, len(steps)):
        if steps[i] != steps[i - 1] + 1:
            return None
        if walks[i][1] + walks[i][3] > walks[i - 1][1] + walks[i - 1][3]:
            return steps[i - 1]
    return None


def test_a_leak_on_some_steps_only_is_measured_from_its_first_occurrence(sometimes: Run, tmp_path: Path) -> None:
    """Its groups' tensors kept per step from their first occurrence to the last inventory, at
    DEFAULT options, as a run ending at 20, 200 and 600 steps would report them: to 1% (and the
    report's rounding) of a count
    without memscope (tests/leaktruth/truth.py after each of the first 24 steps, where it finds
    each group's first rise itself, and at those inventories). The graph nodes the groups share
    (the hidden layer's, under the output's and the helper's local's) are charged to either group
    at an inventory, as its walks fall: the rate is not thrown by that (it was: 3% here, 29% on
    the vae)."""
    inv = sometimes.inventory_steps
    ends = {length: max(s for s in inv if s <= length - 1) for length in (20, 200, SOMETIMES)}
    out = tmp_path / "truth.json"
    walk_at = ",".join(["1-24", *map(str, sorted(set(ends.values()) - set(range(1, 25))))])
    proc = subprocess.run([sys.executable, str(TRUTH), "--at", out.name, walk_at, str(SCRIPT), "--leak", "sometimes",
                           "--steps", str(SOMETIMES)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    walked: list[int] = doc["steps"]
    truth = {k: v for k, v in doc["groups"].items() if k.startswith("[10, ")}  # its tensors' shapes
    site = _line(SCRIPT, "rare_errors.append(e)")
    for length, last in ends.items():
        got = [lk for lk in sometimes.leaks_at(length - 1) if lk.shape and lk.shape[0] == 10]
        assert {f"{lk.shape}|{lk.dtype}|{lk.grad_fn}" for lk in got} == set(truth), (length, got)
        assert any(str(lk.held_by).startswith("__main__.rare_errors[*].__traceback__.<frame check_output>.")
                   for lk in got), (length, [lk.held_by for lk in got])
        for lk in got:
            walks = truth[f"{lk.shape}|{lk.dtype}|{lk.grad_fn}"]
            start = _first_rise(walked, walks)
            assert start is not None and lk.first_step == start and lk.last_step == last, (length, lk, start)
            a, z = walks[walked.index(start)], walks[walked.index(last)]
            want = (z[1] + z[3] - a[1] - a[3]) / (last - start)
            assert lk.site == site, (length, lk.site)
            # the bytes its tensors and their graphs keep (what the graphs' nodes cost apart)
            tensor_bytes = lk.bytes_per_step - lk.graph_nodes_per_step * lk.node_cost.bytes
            rounding = 0.5 + 0.0005 * lk.node_cost.bytes  # bytes a step are whole, nodes to 3 places
            assert abs(tensor_bytes - want) <= TOLERANCE * want + rounding, \
                (length, lk.shape, lk.grad_fn, tensor_bytes, want)


def test_nodes_two_groups_share_are_charged_to_one_of_them_at_every_inventory(sometimes: Run) -> None:
    """The kept output and the helper's local are both made from one hidden layer: its graph's
    nodes are charged to the same group at every inventory (groups walked in one order, not the
    order gc lists their tensors), and once only (a node under a root charged its kind's median
    is not walked again from another group's root). Each group's nodes per kept tensor stay put
    (they swung between 1 and 5 a tensor: the local's leak dropped out of 1 run in 8)."""
    per: dict[tuple[str, str], set[float]] = {}
    for r in sometimes.rows:
        if str(r["shape"]).startswith("[10, ") and r["grad_fn"] and r["count"] >= 20:
            per.setdefault((r["shape"], r["grad_fn"]), set()).add(round((r["graph_nodes"] or 0) / r["count"], 2))
    assert {k[1] for k in per} == {"MulBackward0", "ReluBackward0", "AddmmBackward0"}, per
    for key, ratios in per.items():
        # the loop's own current output, hidden layer and local add their graph once: 3 nodes
        assert max(ratios) - min(ratios) <= 0.2, (key, sorted(ratios))

"""``memscope fit SCRIPT.py --gpu SIZE``: the largest micro-batch that fits, and the cheapest
techniques that make the current batch fit, each measured by fake runs of the unchanged script.

1. A fake run of the script as it is (memscope.runners.fake_estimate): its peak, the batch
   argument it parsed (an argparse option named like ``--batch-size``; else its DataLoader's
   ``batch_size``; or the one the user names), its repeated blocks and its optimizer.
2. The largest micro-batch: fake runs at chosen batch sizes until the largest one that fits
   has its successor measured not to (memscope.analysis.fit.next_batch).
3. Plans for the current batch: every combination of bf16 autocast, checkpointing of the
   repeated blocks and a lighter optimizer is a fake run with the technique applied
   (memscope.agent.whatif.techniques, the code ``whatif`` measures real runs with); checkpointing
   is cut to the fewest blocks that fit; selective checkpointing is planned from one block's op
   profile and its plans tried, least recompute first, until one fits; gradient accumulation is
   a fake run at the smaller micro-batch; ZeRO stages over ``--world-size`` ranks are computed from what was live at the
   peak. Ranked by memscope.analysis.fit.rank.

Never imports torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from memscope.analysis import fit as planning
from memscope.analysis import sac_plan
from memscope.analysis.fit import Allowance, BatchArgument, Plan
from memscope.errors import UserError
from memscope.runners.fake_estimate import FakeResult, FakeRunner
from memscope.units import human_bytes, parse_size

SHOWN = 4  # plans shown after the cheapest that fits (--json has them all)
MAX_TRIALS = 40  # fake runs per fit, all searches together
BATCH_TRIALS = 14  # of which the batch search
SELECTIVE_TRIALS = 3  # selective-checkpointing plans tried, least recompute first
ADAM = ("Adam", "AdamW")


@dataclass
class FitResult:
    script: str
    budget: int
    world_size: int
    allowance: Allowance
    baseline: FakeResult
    batch: BatchArgument | None
    max_micro_batch: int | None
    batch_points: dict[int, int]
    plans: list[Plan]
    trials: int
    elapsed: float
    notes: list[str] = field(default_factory=list)

    @property
    def usable(self) -> int:
        return self.allowance.usable(self.budget)

    def as_json(self) -> dict[str, Any]:
        return planning.document(self.budget, self.max_micro_batch,
                                 self.batch.name if self.batch else None, self.plans, self.allowance)


class _Trials:
    """Fake runs of one script, memoised by (batch, techniques, checkpointed blocks)."""

    def __init__(self, runner: FakeRunner, script: str, args: Sequence[str], batch: BatchArgument | None,
                 steps: int, pretend_cuda: bool, budget: int,
                 progress: Callable[[str], None] | None = None) -> None:
        self.runner, self.script, self.args, self.batch = runner, script, list(args), batch
        self.steps, self.pretend_cuda, self.budget = steps, pretend_cuda, budget
        self.progress = progress
        self.cache: dict[tuple[Any, ...], FakeResult | None] = {}
        self.count = 0
        self.failures: list[str] = []

    def run(self, batch: int | None, techniques: Sequence[str] = (),
            checkpoint: list[str] | str | None = None, sac: list[str] | None = None,
            profile: bool = False) -> FakeResult | None:
        key = (batch, tuple(sorted(techniques)), tuple(checkpoint) if isinstance(checkpoint, list) else checkpoint,
               tuple(sac) if sac is not None else None, profile)
        if key in self.cache:
            return self.cache[key]
        if self.count >= MAX_TRIALS:
            if not any("fake runs" in f for f in self.failures):
                self.failures.append(f"stopped after {MAX_TRIALS} fake runs: some plans were not tried")
            return None
        self.count += 1
        if self.progress is not None:  # the base run is fake run 1
            what = " + ".join([*techniques, *(["checkpointing"] if checkpoint else []),
                               *(["selective checkpointing"] if sac is not None else []),
                               *(["profile"] if profile else [])]) or "as is"
            at = f"{self.batch.name} {batch}, " if batch is not None and self.batch is not None else ""
            self.progress(f"fake run {self.count + 1} ({at}{what})")
        args, loader = self.args, None
        if batch is not None and self.batch is not None:
            if self.batch.kind == "option":
                args = self.batch.script_args(self.args, batch)
            else:
                loader = batch
        result = self.runner.run(self.script, args, steps=self.steps, techniques=techniques,
                                 checkpoint_blocks=checkpoint, dataloader_batch=loader,
                                 gpu_memory=self.budget, pretend_cuda=self.pretend_cuda,
                                 sac_save=sac, sac_profile=profile)
        if not result.ok:
            what = " + ".join([*techniques, *(["checkpointing"] if checkpoint else []),
                               *(["selective checkpointing"] if sac is not None else [])]) or "as is"
            self.failures.append(f"batch {batch}, {what}: {result.error or result['status']} "
                                 f"(log: {result.log})")
            self.cache[key] = None
            return None
        self.cache[key] = result
        return result


def _flops_per_sample(r: FakeResult, batch: int | None) -> float | None:
    steps = r.steps
    flops = steps[-1].get("flops") if steps else None
    if not flops:
        return None
    return float(flops) / (batch or 1)


def fit(script: str, args: Sequence[str], budget: int, world_size: int = 1,
        allowance: Allowance | None = None, batch_arg: str | None = None, steps: int = 2,
        pretend_cuda: bool = True, workdir: str | None = None,
        progress: Callable[[str], None] | None = None) -> FitResult:
    """``progress`` is told which fake run is under way."""
    started = time.monotonic()
    allowance = allowance or Allowance()
    usable = allowance.usable(budget)
    if usable <= 0:
        raise UserError(f"fit: a {human_bytes(budget)} GPU leaves nothing for tensors after the "
                        f"{human_bytes(allowance.cuda_context)} CUDA context allowance")
    with FakeRunner(workdir) as runner:
        if progress is not None:
            progress("fake run 1 (as is; the first starts python and imports torch)")
        base = runner.run(script, args, steps=steps, gpu_memory=budget, pretend_cuda=pretend_cuda)
        if not base.ok:
            error = base.error or ("completed no training step" if base["status"] == "ended" else "ended early")
            raise UserError(f"fit: {script} failed in the fake run: {error} (log: {base.log})")
        batch = planning.find_batch_argument(base["argparse"] or [], base["dataloader_batches"] or [],
                                             batch_arg)
        notes: list[str] = []
        if batch_arg is not None and batch is None:
            raise UserError(f"fit: --batch-arg {batch_arg}: the script has no such option with an "
                            "integer value (nor a DataLoader, for 'DataLoader')")
        if batch is None:
            notes.append("no batch argument found (an argparse option named like --batch-size, or a "
                         "DataLoader's batch_size): name it with --batch-arg to search the micro-batch")
        trials = _Trials(runner, script, args, batch, steps, pretend_cuda, budget, progress)
        b0 = batch.value if batch else None
        trials.cache[(b0, (), None, None, False)] = base
        points: dict[int, int] = {}
        max_batch = None
        if batch is not None:
            max_batch = _search_batch(trials, batch, base, usable, points, notes)
        if base.gpu_peak_rounded <= usable:
            plans = [Plan([], base.gpu_peak_rounded, True, planning.describe_cost([], None), 0.0)]
        else:
            plans = _plans(trials, base, b0, usable, world_size, notes)
        notes.extend(trials.failures[:5])
    return FitResult(script, budget, world_size, allowance, base, batch, max_batch, points, plans,
                     trials.count + 1, time.monotonic() - started, notes)


def _search_batch(trials: _Trials, batch: BatchArgument, base: FakeResult, usable: int,
                  points: dict[int, int], notes: list[str]) -> int | None:
    points[batch.value] = base.gpu_peak_rounded
    for _ in range(BATCH_TRIALS):
        guess = planning.next_batch(points, usable)
        if guess is None:
            break
        r = trials.run(guess)
        if r is None:
            notes.append(f"the fake run at {batch.name} {guess} failed: the search stopped there")
            break
        points[guess] = r.gpu_peak_rounded
        if len(points) == 2 and points[guess] == points[batch.value]:
            notes.append(f"{batch.name} {guess} has the same peak as {batch.value}: it does not set "
                         "the micro-batch (name the right one with --batch-arg)")
            return None
    else:
        if planning.next_batch(points, usable) is not None:
            notes.append(f"the batch search stopped after {BATCH_TRIALS} fake runs: "
                         f"{planning.largest_fitting(points, usable)} fits, larger ones are not all tried")
    return planning.largest_fitting(points, usable)


@dataclass
class _Measured:
    techniques: list[dict[str, Any]]  # as the plan shows them
    run: FakeResult
    micro: int | None  # the micro-batch of the run
    names: list[str]  # the agent techniques of the run (mixed_precision, lighter_optimizer)
    checkpoint: list[str] | str | None  # its checkpointing request
    sac: list[str] | None = None  # selective checkpointing: the ops whose outputs are kept


def _plans(trials: _Trials, base: FakeResult, b0: int | None, usable: int, world: int,
           notes: list[str]) -> list[Plan]:
    params = base["param_dtypes"] or {}
    sixteen = (params.get("bfloat16", 0) + params.get("float16", 0)) >= 0.5 * (sum(params.values()) or 1)
    blocks = (base["blocks"] or {}).get("names") or []
    container = (base["blocks"] or {}).get("container") or ""
    optimizers = base["optimizers"] or []
    modules = {m["module"]: m for m in base["modules"] or []}
    largest_block = max((modules.get(n, {}).get("param_bytes", 0) for n in blocks), default=0)

    def techniques_of(names: list[str], ckpt: Any, r: FakeResult) -> list[dict[str, Any]] | None:
        out: list[dict[str, Any]] = []
        if "mixed_precision" in names:
            out.append(planning.mixed_precision())
        if ckpt is not None:
            applied = [t for t in r["techniques"] or [] if t.get("technique") == "activation_checkpointing"]
            if not applied or not applied[0].get("applied"):
                return None  # nothing to checkpoint in this model
            if isinstance(ckpt, list):
                out.append(planning.checkpointing(ckpt, len(blocks), container))
            elif blocks:
                out.append(planning.checkpointing(blocks, len(blocks), container))
            else:  # a Sequential, through checkpoint_sequential
                segs = applied[0].get("segments")
                name = applied[0].get("container") or "(model)"
                out.append({"technique": "activation_checkpointing",
                            "blocks": [f"{name} in {segs} segments (checkpoint_sequential)"], "of": segs})
        if "lighter_optimizer" in names:
            out.append(planning.lighter_optimizer([o for o in optimizers if o in ADAM]))
        return out

    measured = [_Measured([], base, b0, [], None)]
    options: list[list[str]] = [[]] + ([["mixed_precision"]] if not sixteen else [])
    if any(o in ADAM for o in optimizers):
        options += [o + ["lighter_optimizer"] for o in options]
    combos = [(names, ck) for names in options for ck in (None, "*") if names or ck]
    combos.sort(key=lambda c: planning.score(
        ([planning.mixed_precision()] if "mixed_precision" in c[0] else [])
        + ([{"technique": "lighter_optimizer"}] if "lighter_optimizer" in c[0] else [])
        + ([{"technique": "activation_checkpointing"}] if c[1] else []), 0.33))
    for names, ck in combos:
        r = trials.run(b0, names, ck)
        techs = techniques_of(names, ck, r) if r is not None else None
        if r is None or techs is None:
            continue
        measured.append(_Measured(techs, r, b0, names, ck))
        stage = _stage_that_fits(r, usable, world, largest_block)
        if ck == "*" and len(blocks) > 1 and stage is not None:
            def peak_of(x: FakeResult, stage: int = stage) -> int:
                return _sharded_peak(x, stage, world, largest_block)

            fewer = _fewest_blocks(trials, b0, names, blocks, usable, r, peak_of)
            if fewer is not None:
                techs_j = techniques_of(names, fewer[0], fewer[1])
                if techs_j is not None:
                    measured.append(_Measured(techs_j, fewer[1], b0, names, fewer[0]))
    if blocks and base.gpu_peak_rounded > usable:
        measured += _selective(trials, b0, usable)
    if b0 is not None and b0 > 1:
        found = 0
        for m in sorted(list(measured), key=lambda m: planning.score(m.techniques, 0.33)):
            if m.run.gpu_peak_rounded <= usable or found >= 3:
                continue
            acc = _accumulate(trials, b0, m, usable)
            if acc is not None:
                measured.append(acc)
                found += acc.run.gpu_peak_rounded <= usable
    base_fps = _flops_per_sample(base, b0)
    plans: list[Plan] = []
    for m in measured:
        r, techs = m.run, m.techniques
        fps = _flops_per_sample(r, m.micro)
        has_ckpt = m.checkpoint is not None or m.sac is not None
        extra = max(0.0, fps / base_fps - 1) if (has_ckpt and fps and base_fps) else (0.33 if has_ckpt else None)
        plans.append(Plan(techs, r.gpu_peak_rounded, r.gpu_peak_rounded <= usable,
                          planning.describe_cost(techs, extra), planning.score(techs, extra or 0.0)))
        if world > 1:
            grads = int(r["gradients"] or 0)
            for stage in (1, 2, 3):
                peak = planning.shard(r.gpu_peak_rounded, r.gpu_breakdown, stage, world, largest_block)
                sharded = [*techs, planning.sharding(stage, world)]
                plans.append(Plan(sharded, peak, peak <= usable,
                                  planning.describe_cost(sharded, extra, planning.communication(stage, world, grads)),
                                  planning.score(sharded, extra or 0.0), measured=False))
    return planning.rank(plans)


def _sharded_peak(r: FakeResult, stage: int, world: int, largest_block: int) -> int:
    if stage == 0:
        return r.gpu_peak_rounded
    return planning.shard(r.gpu_peak_rounded, r.gpu_breakdown, stage, world, largest_block)


def _stage_that_fits(r: FakeResult, usable: int, world: int, largest_block: int) -> int | None:
    """The lowest ZeRO stage (0: none) with which this run's peak fits; None: none does."""
    for stage in (0, 1, 2, 3) if world > 1 else (0,):
        if _sharded_peak(r, stage, world, largest_block) <= usable:
            return stage
    return None


def _fewest_blocks(trials: _Trials, b0: int | None, names: list[str], blocks: list[str],
                   usable: int, every: FakeResult, peak_of: Any) -> tuple[list[str], FakeResult] | None:
    """The first j blocks checkpointed, j the fewest whose peak (``peak_of``: with the ZeRO
    stage the plan needs) fits: less recompute than all of them. j is first predicted from the
    peaks with none and with all checkpointed, then checked by fake runs."""
    n = len(blocks)
    without = trials.run(b0, names, None)
    if without is None or peak_of(without) <= usable:
        return None
    saved_all = peak_of(without) - peak_of(every)
    if saved_all <= 0:
        return None
    j = max(1, min(n - 1, math.ceil(n * (peak_of(without) - usable) / saved_all)))
    seen: dict[int, FakeResult] = {}
    for _ in range(4):
        r = trials.run(b0, names, blocks[:j])
        if r is None:
            break
        seen[j] = r
        if peak_of(r) <= usable:
            if j == 1 or (j - 1 in seen and peak_of(seen[j - 1]) > usable):
                break
            j -= 1
        else:
            if j + 1 in seen or j + 1 >= n:
                break
            j += 1
    fitting = [k for k, r in seen.items() if peak_of(r) <= usable]
    if not fitting:
        return None
    k = min(fitting)
    return blocks[:k], seen[k]


def _selective(trials: _Trials, b0: int | None, usable: int) -> list[_Measured]:
    """Selective checkpointing of every repeated block, planned from the first block's op
    profile (a fake run of the script as it is with the profile on; fake tensors have shapes,
    which is all the profile reads): the selective plans on the curve that recompute fewer FLOPs
    than whole-block checkpointing, the fewest first, each a fake run, until one fits."""
    prof = trials.run(b0, (), None, profile=True)
    data = prof.data.get("sac_profile") if prof is not None else None
    if not isinstance(data, dict):
        return []
    try:
        p = sac_plan.parse_profile(data)
    except ValueError:
        return []
    whole = sac_plan.point(p, frozenset())
    pts = sorted((pt for pt in sac_plan.curve(p) if pt.save and pt.blocks == p.blocks
                  and pt.recompute_flops < whole.recompute_flops), key=lambda pt: pt.recompute_flops)
    out: list[_Measured] = []
    for pt in pts[:SELECTIVE_TRIALS]:
        r = trials.run(b0, (), None, list(pt.save or ()))
        if r is None or not any(t.get("technique") == "selective_checkpointing" and t.get("applied")
                                for t in r["techniques"] or []):
            continue
        out.append(_Measured([sac_plan.technique_json(p, pt)], r, b0, [], None, list(pt.save or ())))
        if r.gpu_peak_rounded <= usable:
            break
    return out


def _accumulate(trials: _Trials, b0: int, m: _Measured, usable: int) -> _Measured | None:
    """The fewest accumulation steps k (dividing the batch) whose micro-batch b0/k fits with
    these techniques, checked by a fake run; the next k predicted linearly in the micro-batch
    from the runs at b0 and the last one tried."""
    ks = planning.divisors_for_accumulation(b0)
    k = ks[0] if ks else None
    for _ in range(3):
        if k is None:
            return None
        run = trials.run(b0 // k, m.names, m.checkpoint, m.sac)
        if run is None:
            return None
        if run.gpu_peak_rounded <= usable:
            return _Measured([*m.techniques, planning.accumulation(k, b0 // k, b0)], run, b0 // k,
                             m.names, m.checkpoint, m.sac)
        slope = (m.run.gpu_peak_rounded - run.gpu_peak_rounded) / (b0 - b0 // k)
        if slope <= 0:
            return None
        micro = math.floor(b0 // k + (usable - run.gpu_peak_rounded) / slope)
        k = next((x for x in ks if x > k and b0 // x <= max(1, micro)), None)
    return None


# -- output ----------------------------------------------------------------------------------------


def render(res: FitResult) -> str:
    b = res.batch
    base = res.baseline
    lines = [f"fit {res.script} on a {human_bytes(res.budget)} GPU"
             + (f" x {res.world_size} ranks" if res.world_size > 1 else "")
             + f" ({res.trials} fake runs, {res.elapsed:.1f} s)"]
    lines.append(f"  budget      {res.allowance.describe(res.budget)}")
    verdict = "fits" if base.gpu_peak_rounded <= res.usable else "does NOT fit"
    at = f"batch {b.value} ({b.name})" if b else "as it is"
    lines.append(f"  as is       {at}: allocator peak {human_bytes(base.gpu_peak_rounded)}, {verdict}")
    if b is not None and res.max_micro_batch is not None:
        nxt = res.max_micro_batch + 1
        after = f"; {nxt} needs {human_bytes(res.batch_points[nxt])}" if nxt in res.batch_points else ""
        if res.max_micro_batch == 0:
            lines.append(f"  micro-batch not even {b.name} 1 fits as it is"
                         + (f" (it needs {human_bytes(res.batch_points[1])})" if 1 in res.batch_points else ""))
        else:
            lines.append(f"  micro-batch largest that fits as it is: {b.name} {res.max_micro_batch} "
                         f"(peak {human_bytes(res.batch_points[res.max_micro_batch])}{after})")
    if len(res.plans) == 1 and not res.plans[0].techniques and res.plans[0].fits:
        lines.append("  plans       none needed: the script fits as it is")
    else:
        lines.append(f"  plans for {'batch ' + str(b.value) if b else 'the script as it is'}, "
                     "cheapest first (* peak computed, not run):")
        rows = [["", "fits", "peak", "techniques", "cost"]]
        first_fit = next((i for i, p in enumerate(res.plans) if p.fits), None)
        shown = [p for i, p in enumerate(res.plans) if first_fit is None or i <= first_fit + SHOWN]
        for i, p in enumerate(shown):
            rows.append(["->" if i == first_fit else "", "yes" if p.fits else "no",
                         human_bytes(p.peak_bytes) + ("" if p.measured else "*"),
                         describe_techniques(p.techniques), p.cost])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            lines.append(("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths))).rstrip())
        if len(shown) < len(res.plans):
            lines.append(f"  ... {len(res.plans) - len(shown)} more plans save more at a higher cost "
                         "(--json lists all)")
        if first_fit is None:
            lines.append("  no plan fits: a bigger GPU, more ranks (--world-size), or a smaller model")
    lines.extend(f"  note: {n}" for n in res.notes)
    lines.append("  not counted: cuBLAS/cuDNN workspaces, DDP/ZeRO communication buckets, code "
                 "paths that differ on a GPU (flash attention, fused optimizers)")
    return "\n".join(lines)


def describe_techniques(techniques: Sequence[dict[str, Any]]) -> str:
    if not techniques:
        return "as is"
    words = []
    for t in techniques:
        kind = t["technique"]
        if kind == "mixed_precision":
            words.append("bf16 autocast")
        elif kind == "activation_checkpointing":
            bl = t["blocks"]
            span = bl[0] if len(bl) == 1 else f"{bl[0]}..{bl[-1].rsplit('.', 1)[-1]}"
            words.append(f"checkpoint {span}" + (f" ({len(bl)}/{t['of']})" if t.get("container") else ""))
        elif kind == "selective_checkpointing":
            bl = t["blocks"]
            span = bl[0] if len(bl) == 1 else f"{bl[0]}..{bl[-1].rsplit('.', 1)[-1]}"
            keep = ", ".join(op.split(".", 1)[-1] for op in t["save"])
            words.append(f"selective {span} (keep {keep})")
        elif kind == "gradient_accumulation":
            words.append(f"accumulate {t['steps']} x {t['micro_batch']}")
        elif kind == "sharding":
            words.append(f"ZeRO-{t['stage']}")
        elif kind == "lighter_optimizer":
            words.append("SGD-momentum")
        else:
            words.append(kind)
    return " + ".join(words)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, say: Callable[[str], None] = _stderr,
        progress: Callable[[str], None] | None = None) -> int:
    """``memscope fit``: ``say`` prints its informational line, ``progress`` is told which fake
    run is under way (memscope.cli.progress)."""
    script = args.script
    if not script:
        raise UserError("fit: give a script: memscope fit --gpu 24GiB train.py ARGS")
    if not os.path.isfile(script):
        raise UserError(f"fit: no such script: {script}")
    if not args.gpu:
        raise UserError("fit: --gpu SIZE is required (e.g. --gpu 24GiB)")
    try:
        budget = parse_size(args.gpu)
        context = parse_size(args.cuda_context) if args.cuda_context not in (None, "0") else 0
    except ValueError as exc:
        raise UserError(f"fit: {exc}") from None
    if args.world_size < 1:
        raise UserError(f"fit: --world-size must be at least 1, not {args.world_size}")
    if not 0 <= args.fragmentation < 1:
        raise UserError(f"fit: --fragmentation must be between 0 and 1, not {args.fragmentation}")
    allowance = Allowance(context, args.fragmentation)
    if allowance.usable(budget) <= 0:
        raise UserError(f"fit: a {human_bytes(budget)} GPU leaves nothing for tensors after the "
                        f"{human_bytes(allowance.cuda_context)} CUDA context allowance")
    workdir = tempfile.mkdtemp(prefix="memscope-fit-")
    say(f"memscope fit: fake runs of {script} ...")
    res = fit(script, list(args.script_args or []), budget, args.world_size, allowance,
              args.batch_arg, pretend_cuda=not args.cpu, workdir=workdir, progress=progress)
    if not any("(log: " in n for n in res.notes):
        shutil.rmtree(workdir, ignore_errors=True)  # the logs matter only when a trial failed
    if args.json:
        print(json.dumps(res.as_json(), indent=2))
    else:
        print(render(res))
    return 0

"""``memscope whatif [--try TECHNIQUE ...] SCRIPT.py [ARGS...]``: apply a technique to an unchanged
script, measure the saving, and set it beside the estimate."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

from memscope.display import shown_text
from memscope.agent.runtime.config import TECHNIQUES
from memscope.analysis.suggestions import checkpoint_plan_for, suggest
from memscope.analysis.summary import summarize
from memscope.analysis.whatif import Comparison, compare, estimate_for, measure, to_json
from memscope.cli.errors import CliError
from memscope.cli.file_options import add_group_readable
from memscope.cli.progress import info, update
from memscope.cli.whatif_selective import SelectiveTrial
from memscope.runners.fix_leak import MIN_STEPS, try_fix_leak
from memscope.runners.script_estimate import run_recorded
from memscope.units import human_bytes
from memscope.safe_files import make_dir
from memscope.store.reader import RunReader

HELP = "run a script with and without a memory-saving technique; measured vs estimated saving"
_MEASURES = {"tensor_peak": "peak of live tensor bytes (exact, per step)",
             "breakdown": "profiled breakdown (params + grads + optimizer state + activations)",
             "cuda_allocated": "CUDA allocator peak", "rss": "host RSS peak"}


def register(parser: argparse.ArgumentParser) -> None:
    parser.usage = ("memscope whatif [--try TECHNIQUE ...] [--steps N] [--db-dir DIR] [--group-readable] [--json] "
                    "SCRIPT.py [ARGS...]")
    parser.add_argument("--try", dest="techniques", action="append", default=[], metavar="TECHNIQUE",
                        help=f"technique to try, repeatable ({', '.join(TECHNIQUES)}; default: all); "
                             "fix_leak, on its own, patches the lines that stored the leaks in a copy "
                             "of the script and reruns it")
    parser.add_argument("--steps", type=int, default=6, metavar="N",
                        help="steps per run (default %(default)s; at least 2)")
    parser.add_argument("--db-dir", metavar="DIR",
                        help="where the run files go, created if missing (default: a new temp dir)")
    parser.add_argument("--json", action="store_true", help="print the memscope.whatif/1 JSON document")
    add_group_readable(parser, "the run files, logs and copies in --db-dir")
    parser.add_argument("script", metavar="SCRIPT.py", help="training script, run unchanged")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="the script's own arguments")


def _techniques(words: list[str]) -> list[str]:
    # selective_checkpointing is tried when asked for: it needs a profiled baseline
    chosen = [t for w in words for t in w.split(",") if t] or [t for t in TECHNIQUES
                                                               if t != "selective_checkpointing"]
    known = (*TECHNIQUES, "fix_leak")
    bad = [t for t in chosen if t not in known]
    if bad:
        raise CliError(f"whatif: unknown technique {bad[0]!r}; known: {', '.join(known)}")
    if "fix_leak" in chosen and len(set(chosen)) > 1:
        raise CliError("whatif: --try fix_leak is tried on its own (it reruns a patched copy of the script)")
    return list(dict.fromkeys(chosen))


def _suggestions(reader: RunReader) -> tuple[list[Any], str | None, dict[str, Any] | None]:
    """The estimator's suggestions for the baseline, or a note saying why there are none, and
    the checkpointing plan for the trial (the ``checkpoint_plan`` option; None: the trial's own
    choice)."""
    try:
        summary = summarize(reader)
        suggestions = list(suggest(reader, summary))
    except Exception as exc:  # a bug there must not hide the measurement
        return [], f"estimator failed: {type(exc).__name__}: {exc}", None
    try:
        plan = checkpoint_plan_for(reader, summary)
    except Exception:
        plan = None
    # repeated blocks: the trial finds the same ones by itself; a Sequential: tell it which one
    # and in how many segments, so that it measures the plan the estimate is for
    chosen = ({"container": plan.container, "segments": plan.segments}
              if plan is not None and plan.mode == "sequential" else None)
    return suggestions, None, chosen


def run_options(steps: int) -> dict[str, Any]:
    """The agent options of every whatif run (baseline and trials): ``steps`` steps, the exact
    tensor peak from step 1, layers profiled from step 1, no inventories."""
    return {"max_steps": steps, "layers_every": 1, "layers_first": 1, "inventory_every": 0, "tensor_peak": True}


def run(args: argparse.Namespace) -> int:
    techniques = _techniques(args.techniques)
    if args.steps < 2:
        raise CliError("whatif: --steps must be at least 2 (step 0 warms up; from step 1 on is profiled)")
    if not os.path.isfile(args.script):
        raise CliError(f"whatif: no such script: {args.script}")
    if args.db_dir:
        if os.path.exists(args.db_dir) and not os.path.isdir(args.db_dir):
            raise CliError(f"whatif: --db-dir {args.db_dir}: exists and is not a directory")
        try:
            make_dir(args.db_dir, args.group_readable)  # as export --csv DIR does
        except OSError as exc:
            raise CliError(f"whatif: --db-dir {args.db_dir}: {exc.strerror or exc}") from None
        if not os.access(args.db_dir, os.W_OK | os.X_OK):
            raise CliError(f"whatif: --db-dir {args.db_dir}: not writable")
    workdir = args.db_dir or tempfile.mkdtemp(prefix="memscope-whatif-")
    stem = os.path.splitext(os.path.basename(args.script))[0]
    options = run_options(args.steps)

    if techniques == ["fix_leak"]:
        return _fix_leak(args, workdir)

    runs = 1 + len(techniques)

    def one(label: str, tries: list[str], plan: dict[str, Any] | None = None, **more: Any) -> Any:
        db = os.path.join(workdir, f"whatif-{stem}-{label}.db")
        done = 0 if label == "baseline" else techniques.index(label) + 1
        info(f"memscope whatif: {label}: {args.steps} steps of {args.script} ...")
        update(f"run {done + 1} of {runs}: {label}, {args.steps} steps")
        return run_recorded(args.script, args.script_args, db,
                            {**options, "try_techniques": tries, "checkpoint_plan": plan, **more},
                            group_readable=args.group_readable)

    # the blocks' op profile and backward windows: selective checkpointing's plan, and the peak
    # whole-block checkpointing leaves (memscope.analysis.suggestions.checkpointing)
    base_run = one("baseline", [], sac_profile=bool({"selective_checkpointing", "activation_checkpointing"}
                                                    & set(techniques)))
    if not base_run.ok:
        print(f"memscope: error: whatif: the baseline run failed ({_why(base_run)}): "
              f"{base_run.last_error()} (log: {base_run.log})", file=sys.stderr)
        return 1
    with RunReader(base_run.db) as reader:
        baseline = measure(reader)
        suggestions, note, plan = _suggestions(reader)
        selective = SelectiveTrial.from_baseline(reader, baseline.tensor_peak)
    comparisons: list[Comparison] = []
    failures: list[str] = []
    for t in techniques:
        more = {"sac_save": selective.save} if t == "selective_checkpointing" and selective.ok else {}
        trial_run = one(t, [t], plan if t == "activation_checkpointing" else None, **more)
        if not trial_run.ok:
            failures.append(f"{t}: the trial run failed ({_why(trial_run)}): "
                            f"{trial_run.last_error()} (log: {trial_run.log})")
        with RunReader(trial_run.db) as reader:
            trial = measure(reader)
        comparisons.append(compare(t, baseline, trial, estimate_for(suggestions, t)))
        if t == "selective_checkpointing":
            selective.measured_peak = trial.tensor_peak
    if args.json:
        doc = to_json(args.script, args.steps, baseline, comparisons, note)
        if "selective_checkpointing" in techniques:
            doc["selective_checkpointing"] = selective.as_json()
        print(json.dumps(doc, indent=2))
    else:
        print(render(args.script, args.steps, baseline.peak_metric, comparisons, note, workdir))
        if "selective_checkpointing" in techniques:
            print(selective.render())
    for f in failures:
        print(f"memscope: whatif: {f}", file=sys.stderr)
    return 1 if failures else 0


def _why(child: Any) -> str:
    return f"signal {child.signal}" if child.signal is not None else f"exit {child.exit_code}"


def _saving(value: int | None, base: int | None) -> str:
    if value is None:
        return "-"
    share = f" ({value / base * 100:.0f}%)" if base else ""
    sign = "-" if value < 0 else ""
    return f"{sign}{human_bytes(abs(value))}{share}"


def render(script: str, steps: int, metric: str, comps: list[Comparison], note: str | None,
           workdir: str) -> str:
    measured_by = comps[0].measured_by if comps else metric
    lines = [f"what-if: {script}, {steps} steps per run; measured saving = "
             f"{_MEASURES.get(measured_by, measured_by)}"]
    if note:
        lines.append(f"  {shown_text(note)}")
    table = [["technique", "applied", "measured", "estimated", "error", "breakdown",
              "peak (" + metric + ")"]]
    for c in comps:
        base_total = c.baseline.breakdown["total"] if c.baseline.breakdown else None
        base = {"breakdown": base_total, "tensor_peak": c.baseline.tensor_peak}.get(
            c.measured_by, c.baseline.peak_bytes)
        if c.estimated_saving_bytes is None:
            est, err = "not suggested for this run", "-"
        else:
            est = human_bytes(c.estimated_saving_bytes)
            err = "-" if c.estimate_error is None else (
                f"{c.estimate_error * 100:+.0f}%" + ("" if c.within_tolerance else " (>25%)"))
        table.append([c.technique, "yes" if c.applied else "NO", _saving(c.measured_saving_bytes, base),
                      est, err, _saving(c.breakdown_saving_bytes, base_total),
                      _saving(c.peak_saving_bytes, c.baseline.peak_bytes)])
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    for c in comps:
        why = next((a["why"] for a in c.trial.applied
                    if a.get("technique") == c.technique and not a.get("applied") and a.get("why")), None)
        if why:
            lines.append(f"  {c.technique}: not applied: {shown_text(why)}")
        if c.baseline.breakdown and c.trial.breakdown:
            parts = " · ".join(f"{k.replace('_', ' ')} {human_bytes(c.baseline.breakdown[k])} → "
                               f"{human_bytes(c.trial.breakdown[k])}"
                               for k in ("parameters", "gradients", "optimizer_state", "activations")
                               if c.baseline.breakdown[k] != c.trial.breakdown[k])
            if parts:
                lines.append(f"  {c.technique}: {parts}")
    lines.append(f"  run files: {workdir}")
    return "\n".join(lines)


def _fix_leak(args: argparse.Namespace, workdir: str) -> int:
    """``--try fix_leak``: baseline with inventories, the leaks' storing lines patched in a copy,
    the copy rerun; what went away and what it saved."""
    info(f"memscope whatif: fix_leak: {max(args.steps, MIN_STEPS)} steps of {args.script}, then a patched "
         "copy ...")
    update(f"fix_leak: {max(args.steps, MIN_STEPS)} steps of {args.script}, then a patched copy")
    result, last = try_fix_leak(args.script, args.script_args, workdir, args.steps, {},
                                group_readable=args.group_readable)
    if result is None:
        print(f"memscope: error: whatif: a fix_leak run failed ({_why(last)}): {last.last_error()} "
              f"(log: {last.log})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"schema": "memscope.whatif/1", "script": args.script, "fix_leak": result.as_json()},
                         indent=2))
        return 0
    lines = [f"what-if fix_leak: {args.script}, {result.steps} steps per run"]
    if result.note:
        lines.append(f"  {result.note}")
    for p in result.patched:
        lk = p.leak
        if lk is not None:
            what = f"leak {shown_text(lk.held_by or 'unknown')}: +{human_bytes(lk.bytes_per_step)}/step"
        else:
            assert p.hook is not None
            what = f"hooks: {shown_text(p.hook.what)}: +{p.hook.per_step:g}/step"
        if p.path is None:
            lines.append(f"  {what}: not patched: {shown_text(p.why)}")
            continue
        after = "gone" if result.gone(lk, p.hook) else "STILL THERE"
        lines.append(f"  {what}: {after} after patching {shown_text(p.path)}:{p.line}")
        lines.extend(f"    - {shown_text(t.strip())}" for t in p.old.splitlines() if t.strip())
        lines.extend(f"    + {shown_text(t.strip())}" for t in p.new.splitlines() if t.strip())
    if result.kept_before is not None and result.kept_after is not None:
        lines.append(f"  alive at the last inventory (tensors, what their graphs keep): "
                     f"{human_bytes(result.kept_before)} → {human_bytes(result.kept_after)} "
                     f"(saves {_saving(result.kept_before - result.kept_after, result.kept_before)} "
                     f"in {result.steps} steps, and more the longer it runs)")
    if result.copy:
        lines.append(f"  patched copy: {result.copy} (your files are unchanged; memscope leaks --diff "
                     "prints the patch)")
    lines.append(f"  run files: {workdir}")
    print("\n".join(lines))
    return 0 if result.trial is None or all(result.gone(p.leak, p.hook) for p in result.patched if p.path) else 1

"""``memscope leaks RUN.db [--from A] [--to B] [--json] [--diff]``: what grew between two inventories,
which tensor groups leak, and whether there were enough inventories to tell."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from memscope.analysis.hooks import HookGrowth
from memscope.analysis.leak_patch import plan_fix, plan_hoist, split_site
from memscope.analysis.leaks import GroupDiff, Leak, LeakCheck, describe, diff, fix_how, inventory_steps
from memscope.analysis.summary import RunSummary, summarize
from memscope.analysis.unexplained import UnexplainedGrowth
from memscope.analysis.workers import WorkerGrowth
from memscope.cli.errors import CliError
from memscope.constants import WARMUP_STEPS
from memscope.display import shown, shown_text
from memscope.units import human_bytes
from memscope.store.reader import RunReader

HELP = "tensor groups that grow between step inventories, and the leaks among them"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", metavar="RUN.db", help="run file written by memscope attach")
    parser.add_argument("--from", dest="from_step", type=int, metavar="A",
                        help="inventoried step to diff from (default: the first)")
    parser.add_argument("--to", dest="to_step", type=int, metavar="B",
                        help="inventoried step to diff to (default: the last)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--diff", action="store_true",
                        help="print the fix of each leak as a unified diff of the line that stored it "
                             "(patch -p1 applies it); files are read, never written")


def run(args: argparse.Namespace) -> int:
    check_range(args.from_step, args.to_step)
    with RunReader(args.db) as reader:
        s = summarize(reader)
        if args.diff:
            run_row = reader.run() or {}
            print(patches(s.leaks, run_row.get("cwd"), s.hooks), end="")
            return 0
        proc = s.main_proc
        steps = inventory_steps(reader, proc) if proc is not None else []
        if not steps:
            raise CliError(f"leaks: {args.db} has no tensor inventory: {s.leak_check.advice()}")
        a = steps[0] if args.from_step is None else args.from_step
        b = steps[-1] if args.to_step is None else args.to_step
        for name, st in (("--from", a), ("--to", b)):
            if st not in steps:
                shown = ", ".join(map(str, steps[:20])) + (" ..." if len(steps) > 20 else "")
                raise CliError(f"leaks: {name} {st} is not an inventoried step (inventoried: {shown})")
        changes = diff(reader, proc, a, b)  # type: ignore[arg-type]
    if args.json:
        print(json.dumps({"from": a, "to": b, "inventoried_steps": steps,
                          "diff": [_diff_json(d) for d in changes],
                          "leaks": [_leak_json(lk) for lk in s.leaks],
                          "leak_check": s.leak_check.as_json(),
                          "unexplained_growth": s.unexplained.as_json() if s.unexplained else None,
                          "dataloader_workers": s.workers.as_json() if s.workers else None,
                          "hook_growth": [h.as_json() for h in s.hooks]},
                         indent=2))
    else:
        print(render(a, b, steps, changes, s))
    return 0


def check_range(a: int | None, b: int | None) -> None:
    """Refuse a step range that cannot be meant: steps are numbered from 0, and a diff runs
    forward in time (a reversed range would show every growth as a shrink)."""
    for name, st in (("--from", a), ("--to", b)):
        if st is not None and st < 0:
            raise CliError(f"leaks: {name} {st}: steps are numbered from 0")
    if a is not None and b is not None and a > b:
        raise CliError(f"leaks: --from {a} is after --to {b}: give the earlier step to --from")


def _diff_json(d: GroupDiff) -> dict[str, Any]:
    return {"category": d.category, "dtype": d.dtype, "shape": d.shape, "grad_fn": d.grad_fn,
            "device": d.device, "count_from": d.count_from, "count_to": d.count_to,
            "bytes_from": d.bytes_from, "bytes_to": d.bytes_to,
            "count_delta": d.count_delta, "bytes_delta": d.bytes_delta}


def _leak_json(lk: Leak) -> dict[str, Any]:
    return {**lk.as_json(), "grad_fn": lk.grad_fn, "how": fix_how(lk)}


def _what(category: str, dtype: str | None, shape: list[int] | None, grad_fn: str | None) -> str:
    return shown_text(f"{category} {dtype} {shape}" + (f" {grad_fn}" if grad_fn else ""))


def render(a: int, b: int, steps: list[int], changes: list[GroupDiff], s: RunSummary,
           top: int = 15) -> str:
    lines = [f"inventories at steps {', '.join(map(str, steps[:20]))}{' ...' if len(steps) > 20 else ''}",
             f"change from step {a} to step {b} (bytes include autograd graphs kept alive):"]
    if not changes:
        lines.append("  nothing changed")
    table = [["group", "tensors", "bytes"]]
    for d in changes[:top]:
        sign = "+" if d.bytes_delta >= 0 else "-"
        table.append([_what(d.category, d.dtype, d.shape, d.grad_fn),
                      f"{d.count_from} → {d.count_to}",
                      f"{sign}{human_bytes(abs(d.bytes_delta))}"])
    if len(table) > 1:
        widths = [max(len(r[i]) for r in table) for i in range(3)]
        for r in table:
            lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                          for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    if len(changes) > top:
        lines.append(f"  ... {len(changes) - top} more (--json for all)")
    lines.extend(verdict_lines(s))
    return "\n".join(lines)


def verdict_lines(s: RunSummary) -> list[str]:
    """The verdicts: leaks, or none, or not enough inventories to tell; growth no tensor group
    explains; DataLoader workers' copy-on-read."""
    out = [line for lk in s.leaks for line in leak_lines(lk)]
    if not s.leaks:
        out.append(none_line(s.leak_check))
    note = s.leak_check.coverage()
    if note:
        out.append(f"note: {shown_text(note)}")
    out.extend(line for h in s.hooks for line in hook_lines(h))
    if s.unexplained is not None:
        out.extend(unexplained_lines(s.unexplained))
    if s.workers is not None:
        out.extend(worker_lines(s.workers))
    return out


def hook_lines(h: HookGrowth) -> list[str]:
    return [f"HOOKS {shown_text(h.what)}: +{h.per_step:g}/step ({h.count} now), "
            f"steps {h.first_step}–{h.last_step}"
            + (f" · registered at {shown(h.site)}" if h.site else ""),
            f"      fix: {shown_text(h.how())}"]


def none_line(check: LeakCheck) -> str:
    if check.verdict == "ok":
        return (f"leaks: none (no group grew steadily to the end of the run; {check.inventories} "
                f"inventories from step {WARMUP_STEPS} on)")
    return f"leaks: not enough inventories to tell: {check.advice()}"


def leak_lines(lk: Leak) -> list[str]:
    if lk.kind == "graph":
        head = (f"LEAK  {shown_text(describe(lk))}: ~{human_bytes(lk.bytes_per_step)}/step "
                f"({lk.node_cost.phrase()}), steps {lk.first_step}–{lk.last_step}")
    else:
        head = (f"LEAK  {shown_text(describe(lk))}: +{human_bytes(lk.bytes_per_step)}/step, "
                f"{lk.tensors_per_step:g} tensors/step, steps {lk.first_step}–{lk.last_step}")
    if lk.accelerating:
        head += (f", accelerating (+{human_bytes(lk.rate_first)}/step in the first half, "
                 f"+{human_bytes(lk.rate_last)}/step in the second)")
    out = [head,
           f"      held by {shown(lk.held_by or 'unknown')}"
           + (f" · stored at {shown(lk.site)}" if lk.site else "")
           + (f" · made at {shown(lk.created_at)}" if lk.created_at and lk.created_at != lk.site else "")
           + (f" · from the forward of {shown(lk.module) or '(model)'}" if lk.module is not None else "")]
    if lk.cause:
        out.append(f"      why it accelerates: {shown_text(lk.cause)}")
    out.append(f"      fix: {shown_text(fix_how(lk))}")
    return out


def unexplained_lines(u: UnexplainedGrowth) -> list[str]:
    metric = u.label
    return [f"GROWTH {metric} +{human_bytes(u.bytes_per_step)}/step from step {u.first_step} to "
            f"{u.last_step} that no tensor group explains (inventories: {u.explained_words()})",
            f"      fix: {shown_text(u.how())}"]


def worker_lines(w: WorkerGrowth) -> list[str]:
    per_step = f", ~{human_bytes(w.bytes_per_step)}/step" if w.bytes_per_step else ""
    return [f"WORKERS {w.workers} of {w.of_workers} DataLoader worker(s) copied "
            f"{human_bytes(w.uss_end - w.uss_start)} of the dataset into private memory "
            f"({human_bytes(w.uss_start)} → {human_bytes(w.uss_end)} USS in {w.seconds:.0f} s{per_step})",
            f"      fix: {shown_text(w.how())}"]


def patches(leaks: list[Leak], cwd: str | None, hooks: list[HookGrowth] | None = None) -> str:
    """Each leak's fix as a unified diff of the line that stored it (and each hook registered
    again and again, registered once before its loop), or why there is none (lines starting
    with ``#``: ``patch`` skips them)."""
    out: list[str] = []
    done: set[tuple[str, int]] = set()
    items: list[tuple[str, str | None, Any]] = [
        (f"# LEAK {shown_text(describe(lk))}, held by {shown(lk.held_by or 'unknown')}", lk.site, lk)
        for lk in leaks]
    items += [(f"# HOOKS {shown_text(h.what)}: +{h.per_step:g}/step", h.site, h) for h in hooks or []]
    for head, site, what in items:
        where = split_site(site) if site else None
        if where is None:
            known = "the line that registered them" if isinstance(what, HookGrowth) else "the line that stored it"
            out += [head, f"# no patch: {known} is not known\n"]
            continue
        path, line = where
        full = path if os.path.isabs(path) or not cwd else os.path.join(cwd, path)
        try:
            with open(full, encoding="utf-8") as f:
                source = f.readlines()
        except (OSError, UnicodeDecodeError) as exc:
            out += [head, f"# no patch: cannot read {shown(full)} ({type(exc).__name__}): run this where the run ran\n"]
            continue
        plan, why = plan_hoist(source, line) if isinstance(what, HookGrowth) else plan_fix(source, line, what)
        if plan is None:
            out += [head, f"# no patch: {shown_text(why)}\n"]
            continue
        if (full, plan.line) in done:
            out += [head, "# the patch above fixes it too (one line stored both)\n"]
            continue
        done.add((full, plan.line))
        rel = path if not os.path.isabs(path) else os.path.relpath(path, cwd or os.getcwd())
        out += [head, f"# {shown_text(why)}", plan.unified(rel, source)]
    if not out:
        return "# no leaks: nothing to patch\n"
    return "\n".join(x.rstrip("\n") for x in out) + "\n"

"""``memscope leaks RUN.db [--from A] [--to B] [--json]``: what grew between two inventories,
and which tensor groups leak."""

from __future__ import annotations

import argparse
import json
from typing import Any

from memscope.analysis.leaks import GroupDiff, Leak, diff, fix_how, inventory_steps, leaks_of
from memscope.analysis.summary import summarize
from memscope.cli.errors import CliError
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


def run(args: argparse.Namespace) -> int:
    with RunReader(args.db) as reader:
        proc = summarize(reader).main_proc
        steps = inventory_steps(reader, proc) if proc is not None else []
        if not steps:
            raise CliError(f"leaks: {args.db} has no tensor inventory "
                           "(attach with --inventory-every N, N > 0)")
        a = steps[0] if args.from_step is None else args.from_step
        b = steps[-1] if args.to_step is None else args.to_step
        for name, s in (("--from", a), ("--to", b)):
            if s not in steps:
                shown = ", ".join(map(str, steps[:20])) + (" ..." if len(steps) > 20 else "")
                raise CliError(f"leaks: {name} {s} is not an inventoried step (inventoried: {shown})")
        changes = diff(reader, proc, a, b)  # type: ignore[arg-type]
        found = leaks_of(reader, proc)
    if args.json:
        print(json.dumps({"from": a, "to": b, "inventoried_steps": steps,
                          "diff": [_diff_json(d) for d in changes],
                          "leaks": [_leak_json(lk) for lk in found]}, indent=2))
    else:
        print(render(a, b, steps, changes, found))
    return 0


def _diff_json(d: GroupDiff) -> dict[str, Any]:
    return {"category": d.category, "dtype": d.dtype, "shape": d.shape, "grad_fn": d.grad_fn,
            "device": d.device, "count_from": d.count_from, "count_to": d.count_to,
            "bytes_from": d.bytes_from, "bytes_to": d.bytes_to,
            "count_delta": d.count_delta, "bytes_delta": d.bytes_delta}


def _leak_json(lk: Leak) -> dict[str, Any]:
    return {**lk.as_json(), "grad_fn": lk.grad_fn, "how": fix_how(lk)}


def _what(category: str, dtype: str | None, shape: list[int] | None, grad_fn: str | None) -> str:
    return f"{category} {dtype} {shape}" + (f" {grad_fn}" if grad_fn else "")


def render(a: int, b: int, steps: list[int], changes: list[GroupDiff], found: list[Leak],
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
    if not found:
        lines.append("leaks: none (no group grew steadily to the end of the run)")
    for lk in found:
        lines.append(f"LEAK  {_what(lk.category, lk.dtype, lk.shape, lk.grad_fn)}: "
                     f"+{human_bytes(lk.bytes_per_step)}/step, {lk.tensors_per_step:g} tensors/step, "
                     f"steps {lk.first_step}–{lk.last_step}")
        lines.append(f"      held by {lk.held_by or 'unknown'}"
                     + (f" · stored at {lk.site}" if lk.site else "")
                     + (f" · from the forward of {lk.module or '(model)'}" if lk.module is not None else ""))
        lines.append(f"      fix: {fix_how(lk)}")
    return "\n".join(lines)

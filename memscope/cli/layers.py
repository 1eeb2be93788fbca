"""``memscope layers RUN.db [--depth N] [--step N] [--json]``: activations by module."""

from __future__ import annotations

import argparse
import json

from memscope.analysis.oom_limits import profile_hint
from memscope.analysis.hotspots import (
    compiled_note,
    choose_step,
    hotspots,
    layer_rows,
    micro_batch_note,
    profiled_steps,
)
from memscope.analysis.summary import summarize
from memscope.cli.errors import CliError
from memscope.display import shown
from memscope.report.json_report import layers_from
from memscope.report.text import render_hotspots
from memscope.store.reader import RunReader

HELP = "per-module activations saved for backward on a profiled step"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", metavar="RUN.db", help="run file written by memscope attach")
    parser.add_argument("--depth", type=int, metavar="N",
                        help="fold modules into their ancestor N dotted names deep (blocks.1)")
    parser.add_argument("--step", type=int, metavar="N",
                        help="profiled step to show (default: the one nearest the peak)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    if args.depth is not None and args.depth < 1:
        raise CliError("layers: --depth must be at least 1")
    if args.step is not None and args.step < 0:
        raise CliError(f"layers: --step {args.step}: steps are numbered from 0")
    with RunReader(args.db) as reader:
        summary = summarize(reader)
        proc = summary.main_proc
        steps = [st for _, st in profiled_steps(reader, proc)] if proc is not None else []
        if not steps:
            hint = profile_hint(summary.steps, summary.oom.step if summary.oom is not None else None,
                                running=summary.status == "running")
            raise CliError(f"layers: {args.db} has no profiled step ({hint})")
        if args.step is not None:
            if args.step not in steps:
                raise CliError(f"layers: step {args.step} was not profiled "
                               f"(profiled: {', '.join(map(str, steps[:20]))})")
            step = args.step
        else:
            step = summary.hotspot_step if summary.hotspot_step in steps else choose_step(steps, None)
        assert step is not None
        doc = layers_from(reader, summary, step, args.depth)
        rows = layer_rows(reader, proc, step)  # type: ignore[arg-type]
        spots = hotspots(rows, args.depth)
        micro, closure = doc["micro_batches"], doc["closure_forwards"]
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        per = micro_batch_note(micro, closure)
        print(f"step {step} (profiled: {', '.join(map(str, steps[:20]))}{' ...' if len(steps) > 20 else ''})"
              + (f" · {per}" if per else ""))
        print(render_hotspots(spots))
        if note := compiled_note(spots, shown):
            print(f"note: {note}")
    return 0


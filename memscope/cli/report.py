"""``memscope report RUN.db [--json]``: what happened in a run."""

from __future__ import annotations

import argparse
import json

from memscope.analysis.summary import summarize
from memscope.report.json_report import report_from_summary
from memscope.report.text import render_summary
from memscope.store.reader import RunReader

HELP = "summarise a run file (text, or the memscope.report/1 JSON document)"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", metavar="RUN.db", help="run file written by memscope attach")
    parser.add_argument("--json", action="store_true", help="print the JSON report")


def run(args: argparse.Namespace) -> int:
    with RunReader(args.db) as reader:
        summary = summarize(reader)
    if args.json:
        print(json.dumps(report_from_summary(summary), indent=2))
    else:
        print(render_summary(summary))
    return 0

"""``memscope report RUN.db [--json]``: what happened in a run."""

from __future__ import annotations

import argparse
import json

from memscope.analysis.summary import RunSummary, summarize
from memscope.cli.common_options import output_flags
from memscope.cli.errors import CliError
from memscope.cli.file_options import add_group_readable
from memscope.cli.progress import info, update
from memscope.report.json_report import report_from_summary
from memscope.report.text import render_summary
from memscope.store.reader import RunReader

HELP = "summarise a run file (text, or the memscope.report/1 JSON document)"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", metavar="RUN.db",
                        help="run file written by memscope attach (or a node file of memscope daemon)")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument(*output_flags("--html"), dest="html", metavar="OUT.html",
                        help="also write a self-contained HTML report (memory chart, hotspots, leaks,"
                             " suggestions, OOM); prints no text report unless --json")
    add_group_readable(parser)


def run(args: argparse.Namespace) -> int:
    if args.html == "-" and args.json:
        raise CliError("report: --html - and --json cannot both write to stdout")
    from memscope.node.nodefile import is_node_file

    if is_node_file(args.db):  # what memscope daemon saw on a node
        return _node_report(args)
    with RunReader(args.db) as reader:
        update(f"reading {args.db}")
        summary = summarize(reader)
        if args.html:
            update(f"writing {args.html}")
            _write_html(reader, summary, args.html, args.group_readable)
    if args.json:
        print(json.dumps(report_from_summary(summary), indent=2))
    elif not args.html:
        print(render_summary(summary))
    return 0


def _write_html(reader: RunReader, summary: RunSummary, path: str, group_readable: bool) -> None:
    from memscope.report.html import render_html
    from memscope.safe_files import Output

    page = render_html(reader, summary)  # built first: a failure leaves no file behind
    out = Output(path, "report: --html", group_readable=group_readable)
    with out as f:
        f.write(page)
    if path != "-":
        info(f"memscope: wrote {out.shown} ({len(page.encode()) // 1024} KiB)")


def _node_report(args: argparse.Namespace) -> int:
    from memscope.node.nodereader import NodeReader
    from memscope.node.report import render_node, summarize_node

    if args.html:
        raise CliError(f"report: --html is for run files; {args.db} is a node file (memscope daemon): "
                       "report it as text or --json")
    with NodeReader(args.db) as reader:
        summary = summarize_node(reader)
    print(json.dumps(summary.as_json(), indent=2) if args.json else render_node(summary))
    return 0

"""``memscope merge OUT.db NODE0.db NODE1.db ...``: one run file from the files of several nodes."""

from __future__ import annotations

import argparse
import sys

from memscope.store.merge import merge_runs

HELP = "combine the run files of several nodes (one per host) into one run file"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT.db", help="the merged run file to create")
    parser.add_argument("inputs", metavar="NODE.db", nargs="+",
                        help="run files to combine, one per node (written by memscope attach --db)")
    parser.add_argument("--force", action="store_true", help="overwrite OUT.db if it exists")


def run(args: argparse.Namespace) -> int:
    result = merge_runs(args.out, args.inputs, force=args.force)
    rows = sum(result.rows.values())
    print(f"memscope: {result.path}: {result.processes} processes from {len(result.inputs)} "
          f"run files, {rows} rows")
    if result.skipped_tables:
        print(f"memscope: note: tables without a proc column not copied: "
              f"{', '.join(result.skipped_tables)}", file=sys.stderr)
    return 0

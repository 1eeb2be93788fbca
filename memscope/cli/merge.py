"""``memscope merge OUT.db NODE0.db NODE1.db ...``: one run file from the files of several nodes."""

from __future__ import annotations

import argparse
import sys

from memscope.cli.errors import CliError
from memscope.cli.file_options import add_group_readable
from memscope.cli.progress import info
from memscope.store.merge import LiveInputs, merge_runs
from memscope.store.merge_check import NotOneJob

HELP = "combine the run files of several nodes (one per host) into one run file"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT.db", help="the merged run file to create")
    parser.add_argument("inputs", metavar="NODE.db", nargs="+",
                        help="run files to combine, one per node (written by memscope attach --db)")
    parser.add_argument("--force", action="store_true", help="overwrite OUT.db if it exists")
    parser.add_argument("--allow-unrelated", action="store_true",
                        help="merge files that do not look like the ranks of one job (no rank "
                             "information, different commands or world sizes, times apart); a "
                             "global rank in two files is still refused")
    parser.add_argument("--allow-live", action="store_true",
                        help="merge inputs whose runs are still being written (what they hold "
                             "so far; a warning names them)")
    add_group_readable(parser, "OUT.db")


def run(args: argparse.Namespace) -> int:
    try:
        result = merge_runs(args.out, args.inputs, force=args.force,
                            one_job=not args.allow_unrelated, allow_live=args.allow_live,
                            group_readable=args.group_readable)
    except LiveInputs as exc:
        raise CliError(f"merge: inputs {exc}; wait for them to end, or pass --allow-live to "
                       "merge what they hold so far") from None
    except NotOneJob as exc:
        raise CliError(f"merge: {exc}: not the nodes of one job (--allow-unrelated merges them "
                       "anyway)") from None
    rows = sum(result.rows.values())
    if result.live:
        print(f"memscope: warning: merged while still being written (what they held so far): "
              f"{', '.join(result.live)}", file=sys.stderr)
    print(f"memscope: {result.path}: {result.processes} processes from {len(result.inputs)} "
          f"run files, {rows} rows")
    if result.missing_ranks:
        info(f"memscope: note: ranks not in the inputs: {_ranges(result.missing_ranks)}")
    if result.skipped_tables:
        info(f"memscope: note: tables without a proc column not copied: "
             f"{', '.join(result.skipped_tables)}")
    return 0


def _ranges(ranks: list[int]) -> str:
    """[2, 3, 4, 7] -> "2-4, 7": a 64-node job's missing ranks in one short line."""
    out: list[str] = []
    start = prev = ranks[0]
    for k in [*ranks[1:], None]:
        if k is not None and k == prev + 1:
            prev = k
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if k is not None:
            start = prev = k
    return ", ".join(out)

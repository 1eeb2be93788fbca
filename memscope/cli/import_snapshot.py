"""``memscope import SNAPSHOT.pickle --db RUN.db``: a CUDA memory snapshot as a run file."""

from __future__ import annotations

import argparse

from memscope.cli import progress
from memscope.cli.common_options import output_flags
from memscope.cli.file_options import add_group_readable
from memscope.store.snapshot import import_snapshot

HELP = "import a torch.cuda.memory._dump_snapshot pickle into a run file (read safely)"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("snapshot", metavar="SNAPSHOT.pickle",
                        help="file written by torch.cuda.memory._dump_snapshot")
    parser.add_argument(*output_flags("--db"), dest="db", metavar="RUN.db", required=True,
                        help="run file to create")
    parser.add_argument("--force", action="store_true", help="overwrite an existing run file")
    add_group_readable(parser, "the run file")


def run(args: argparse.Namespace) -> int:
    counts = import_snapshot(args.snapshot, args.db, args.force, args.group_readable,
                             progress=progress.callback())
    progress.info(f"memscope: {args.db}: {counts['segments']} segment(s) on {counts['devices']} device(s), "
                  f"{counts['ooms']} out-of-memory event(s); see memscope oom {args.db}")
    return 0

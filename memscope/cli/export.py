"""``memscope export RUN.db [--chrome TRACE.json] [--csv DIR_OR_FILE]``: other tools' formats."""

from __future__ import annotations

import argparse
import os
import sqlite3

from memscope.cli import progress
from memscope.cli.errors import CliError
from memscope.report.chrome import write_chrome_trace
from memscope.report.csv_export import write_directory, write_timeline
from memscope.report.sql_text import lenient_text
from memscope.cli.file_options import add_group_readable
from memscope.safe_files import Output
from memscope.store.reader import RunReader
from memscope.store.schema import RunFileError

HELP = "export a run as a Chrome/Perfetto trace (--chrome) or CSV (--csv)"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", metavar="RUN.db", help="run file written by memscope attach")
    parser.add_argument("--chrome", metavar="TRACE.json",
                        help="Chrome trace (open in ui.perfetto.dev or chrome://tracing); - for stdout")
    parser.add_argument("--csv", metavar="DIR_OR_FILE",
                        help="a directory: timeline.csv and one CSV per table; a *.csv file or -:"
                             " the memory timeline only")
    add_group_readable(parser)


def run(args: argparse.Namespace) -> int:
    if not args.chrome and not args.csv:
        raise CliError("export: nothing to do: give --chrome TRACE.json and/or --csv DIR_OR_FILE")
    if args.chrome == "-" and args.csv == "-":
        raise CliError("export: --chrome and --csv cannot both write to stdout")
    with RunReader(args.db) as reader:
        # text that is not UTF-8 (flipped bytes) is exported with U+FFFD in its place: the
        # trace stays valid JSON, the CSV valid UTF-8, and the rest of the run is not lost
        reader.conn.text_factory = lenient_text
        try:
            if args.chrome:
                out = Output(args.chrome, "export: --chrome", group_readable=args.group_readable)
                with out as f:
                    n = write_chrome_trace(reader, f, progress=progress.callback())
                _note(f"chrome trace: {out.shown} ({n} events)")
            if args.csv:
                _export_csv(reader, args.csv, args.group_readable)
        except sqlite3.DatabaseError as exc:
            raise RunFileError(f"{args.db}: damaged run file ({exc})") from None
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise CliError(f"export: cannot write: {exc.strerror or exc}") from None
    return 0


def _export_csv(reader: RunReader, target: str, group_readable: bool) -> None:
    if target == "-" or (target.lower().endswith(".csv") and not os.path.isdir(target)):
        out = Output(target, "export: --csv", group_readable=group_readable)
        progress.update(f"writing {target}")
        with out as f:
            n = write_timeline(reader, f)
        _note(f"csv: {out.shown} ({n} rows)")
        return
    if os.path.exists(target) and not os.path.isdir(target):
        raise CliError(f"export: --csv {target}: exists and is not a directory"
                       " (a single file must end in .csv)")
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise CliError(f"export: --csv {target}: directory {parent} does not exist")
    try:
        written = write_directory(reader, target, group_readable, progress=progress.callback())
    except OSError as exc:
        raise CliError(f"export: --csv {target}: {exc.strerror or exc}") from None
    _note(f"csv: {os.path.join(target, '')} ({len(written)} files, {written.get('timeline.csv', 0)} timeline rows)")


def _note(line: str) -> None:
    # stderr: stdout may be carrying the export itself (-)
    progress.info(f"memscope: {line}")

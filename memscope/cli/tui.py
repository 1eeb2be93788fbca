"""``memscope tui RUN.db``: the dashboard, from the separate memscope-tui distribution."""

from __future__ import annotations

import argparse
import importlib

from memscope.cli.errors import CliError
from memscope.store.reader import RunReader

HELP = "open the terminal dashboard on a run file (needs memscope-tui)"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", metavar="RUN.db", help="run file, finished or still being written")


def run(args: argparse.Namespace) -> int:
    RunReader(args.db).close()  # a bad file fails here with one line, before any UI starts
    try:
        app_module = importlib.import_module("memscope_tui.app")
    except ImportError:
        raise CliError("the dashboard is not installed: pip install ./tui "
                       "(the memscope-tui distribution, which brings textual)") from None
    return int(app_module.run_app(args.db))

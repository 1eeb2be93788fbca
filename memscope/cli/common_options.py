"""Options every command has (``-q/--quiet``, ``--version``), and ``-o/--output``, memray's name
for the file a command records into, as an alias of the option that names it."""

from __future__ import annotations

import argparse

from memscope import __version__

VERSION = f"memscope {__version__}"


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no informational lines or progress on stderr (errors, warnings, the "
                             "training's own output and the command's output stay)")
    parser.add_argument("--version", action="version", version=VERSION, help="print memscope's version")


def output_flags(name: str) -> tuple[str, str, str]:
    """The option strings of the file a command records into: ``name`` (``--db``, ``--html``) and
    its aliases ``-o`` and ``--output`` (as ``memray run -o`` / ``memray flamegraph -o``)."""
    return (name, "-o", "--output")

"""The option every command that writes files for the user has (docs/files.md)."""

from __future__ import annotations

import argparse


def add_group_readable(parser: argparse.ArgumentParser, what: str = "the files this command writes") -> None:
    parser.add_argument("--group-readable", action="store_true",
                        help=f"create {what} 0640, readable by their group (default 0600, "
                             "whatever the umask)")

"""``memscope`` command line: a thin shell that parses, calls the library, sets exit codes."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Sequence

from memscope import __version__
from memscope.cli import attach, export, import_snapshot, layers, leaks, oom, report, tui
from memscope.cli import diff as diff_cmd
from memscope.cli import merge as merge_cmd
from memscope.cli import whatif
from memscope.cli import estimate as estimate_cmd
from memscope.cli import fit as fit_cmd
from memscope.cli.errors import CliError
from memscope.store.schema import RunFileError

COMMANDS = {
    "attach": attach,
    "report": report,
    "layers": layers,
    "tui": tui,
    "leaks": leaks,
    "oom": oom,
    "import": import_snapshot,
    "estimate": estimate_cmd,
    "fit": fit_cmd,
    "whatif": whatif,
    "export": export,
    "merge": merge_cmd,
    "diff": diff_cmd,
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, not a usage block."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{self.prog}: {message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="memscope", description="Memory debugger for PyTorch training.")
    parser.add_argument("--version", action="version", version=f"memscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in COMMANDS.items():
        module.register(sub.add_parser(name, help=module.HELP, description=module.HELP))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list and args_list[0] == "attach":
            # attach owns everything after the script name: parse it by hand (see attach.split)
            return attach.main(args_list[1:])
        parser = build_parser()
        args = parser.parse_args(args_list)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        return int(COMMANDS[args.command].run(args))
    except (CliError, RunFileError) as exc:
        print(f"memscope: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 1
    except KeyboardInterrupt:
        return 130


def entry() -> NoReturn:
    sys.exit(main())

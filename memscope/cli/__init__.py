"""``memscope`` command line: a thin shell that parses, calls the library, sets exit codes."""

from __future__ import annotations

import argparse
import importlib
import os
import sqlite3
import sys
from typing import Any, NoReturn, Sequence

from memscope.name_clash import exit_if_not_ours

# before anything reads memscope's own __init__: another project's may have replaced it
exit_if_not_ours()

from memscope import __version__  # noqa: E402
from memscope.cli import progress  # noqa: E402
from memscope.cli.common_options import add_common  # noqa: E402
from memscope.cli.errors import CliError  # noqa: E402
from memscope.display import guarded_stdout, safe_lines, shown_text  # noqa: E402
from memscope.store.schema import RunFileError  # noqa: E402

# commands whose stdout is data for another program (export -, report --html -, any --json), or
# not ours (tui and top's live view draw on the terminal themselves); every other text command prints through
# memscope.display's guard
_RAW_STDOUT = {"export", "tui", "top", "completion"}
# commands that draw no progress line (memscope.cli.progress): the dashboards, a service, a script
_NO_PROGRESS = {"tui", "daemon", "completion"}

# command -> its module under memscope.cli, imported only when that command runs (or for
# --help): `attach` starts the user's training, and every module imported before it is wall time
# added to the run
COMMANDS = {
    "attach": "attach",
    "detach": "detach",
    "report": "report",
    "layers": "layers",
    "tui": "tui",
    "leaks": "leaks",
    "oom": "oom",
    "import": "import_snapshot",
    "estimate": "estimate",
    "fit": "fit",
    "whatif": "whatif",
    "export": "export",
    "merge": "merge",
    "diff": "diff",
    "top": "top",
    "daemon": "daemon",
    "completion": "completion",
}


def command_module(name: str) -> Any:
    """The module of a command (``register``, ``run``, ``HELP``)."""
    return importlib.import_module(f"memscope.cli.{COMMANDS[name]}")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, not a usage block."""

    def error(self, message: str) -> NoReturn:
        # main prints "memscope: error: " before it: say the subcommand, not "memscope" again
        where = self.prog.removeprefix("memscope").strip()
        raise CliError(f"{where}: {message} (see --help)" if where else f"{message} (see --help)")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` that command's (the other commands' modules are not
    imported: 0.2 CPU s a reader saves)."""
    parser = _Parser(prog="memscope", description="Memory debugger for PyTorch training.")
    parser.add_argument("--version", action="version", version=f"memscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS if only is None else [only]:
        module = command_module(name)
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.register(command)
        add_common(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    progress.set_quiet(False)
    try:
        if args_list and args_list[0] == "attach":
            # attach owns everything after the script name: parse it by hand (see attach.split)
            from memscope.cli import attach

            return int(attach.main(args_list[1:]))
        parser = build_parser(args_list[0] if args_list and args_list[0] in COMMANDS else None)
        args, extra = parser.parse_known_args(args_list)
        if extra:  # argparse would name the top-level parser, not the subcommand they were given to
            where = f"{args.command}: " if args.command else ""
            raise CliError(f"{where}unrecognized arguments: {' '.join(extra)} (see --help)")
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        progress.set_quiet(args.quiet)
        # (nor when the output itself goes to stdout: a binary write there passes no guard)
        to_stdout = "-" in (getattr(args, "html", None), getattr(args, "chrome", None), getattr(args, "csv", None))
        shows = (args.command not in _NO_PROGRESS and (args.command != "top" or args.once)
                 and not to_stdout and progress.wanted(getattr(args, "json", False)))
        with progress.running(f"memscope {args.command}", shows):
            if args.command in _RAW_STDOUT or getattr(args, "json", False) or getattr(args, "html", None) == "-":
                return int(command_module(args.command).run(args))
            with guarded_stdout():  # names from a run file never drive the terminal (memscope.display)
                return int(command_module(args.command).run(args))
    except (CliError, RunFileError) as exc:
        print(f"memscope: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 1
    except KeyboardInterrupt:
        return 130
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        # a damaged file read past the reader's checks (a page that breaks mid-scan)
        print(f"memscope: error: damaged run file ({type(exc).__name__}: {_one_line(exc)})",
              file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(safe_lines(f"memscope: error: {where}{exc.strerror or exc}"), file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug must still end in one line, not a traceback
        if os.environ.get("MEMSCOPE_DEBUG"):
            raise
        print(f"memscope: internal error: {type(exc).__name__}: {_one_line(exc)} (a memscope bug; "
              "MEMSCOPE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    """An error as one line: SQLite quotes whole statements, newlines and all; a name from a run
    file in it is shown through memscope.display (no control characters, bounded length)."""
    return shown_text(" ".join(str(exc).split()))


def entry() -> NoReturn:
    sys.exit(main())

"""``memscope attach``: run a training command unchanged, recorded into a run file."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Sequence

from memscope.agent.runtime.config import TECHNIQUES, AgentOptions
from memscope.units import parse_size
from memscope.cli.common_options import add_common, output_flags
from memscope.cli.errors import CliError
from memscope.cli.progress import info, set_quiet
from memscope.display import safe_lines, shown_text
from memscope.redact import Redaction
from memscope.agent.runtime.config import ENV_DB_ID, EVENT_TORCH_MISSING
from memscope.store import spill
from memscope.store.runs import (compact, discard_run, file_id, finish_run, new_run,
                                 wait_writable)
from memscope.store.schema import RunFileError
from memscope.runners.empty import why_no_agent
from memscope.runners.isolated import rewrite
from memscope.runners.supervisor import (BOOTSTRAP_DIR, LaunchError, check_module, child_environment,
                                         record_killed, resolve, run_child, storage_problem)
from memscope.store.runs import add_event

if TYPE_CHECKING:
    from memscope.store.reader import RunReader

HELP = "run a training script or command with the memscope agent"
USAGE = ("memscope attach [OPTIONS] SCRIPT.py [ARGS...]\n"
         "       memscope attach [OPTIONS] -m MODULE [ARGS...]\n"
         "       memscope attach [OPTIONS] -- COMMAND [ARGS...]\n"
         "       memscope attach --pid PID [OPTIONS]")
_TAKES_VALUE = {"--db", "-o", "--output", "--sample-hz", "--nvml-interval", "--layers-every", "--layers-first",
                "--inventory-every", "--inventory-budget", "--max-steps", "--try", "--simulate-gpu",
                "--pid", "--duration", "--debugger", "--attach-timeout", "--redact"}


def register(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.add_argument(*output_flags("--db"), dest="db", metavar="PATH",
                        help="run file to write (default: memscope-<script>-<time>.db here)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing run file")
    parser.add_argument("--group-readable", action="store_true",
                        help="create the run file (and its -wal, -shm and spill files) 0640, "
                             "readable by the file's group; default 0600, whatever the umask")
    parser.add_argument("--headless", action="store_true",
                        help="no dashboard; print a one-line summary when the run ends")
    parser.add_argument("--sample-hz", type=float, default=AgentOptions.sample_hz, metavar="HZ",
                        help="memory samples per second (default %(default)s)")
    parser.add_argument("--nvml-interval", type=float, default=AgentOptions.nvml_interval,
                        metavar="S", help="seconds between NVML device readings (default %(default)s)")
    parser.add_argument("--no-nvml", action="store_true", help="never call NVML")
    parser.add_argument("--layers-every", type=int, default=AgentOptions.layers_every, metavar="N",
                        help="per-layer activation profiling every N steps (0: never; default %(default)s)")
    parser.add_argument("--layers-first", type=int, default=AgentOptions.layers_first, metavar="N",
                        help="the first profiled step (default %(default)s)")
    parser.add_argument("--inventory-every", type=int, default=None, metavar="N",
                        help="tensor inventory for leak detection every N steps, exactly (0: never; "
                             "default: automatic, every step at first, thinning out as the run "
                             "goes, within --inventory-budget)")
    parser.add_argument("--catch-forward-oom", action="store_true",
                        help="record forward OOMs the script catches itself in every step (by "
                             "default: step 0, profiled steps, steps near the memory limit); adds a "
                             "forward hook to the model's root module")
    parser.add_argument("--inventory-budget", type=float, default=None, metavar="F",
                        help="share of training time inventories may take; with it, "
                             "--inventory-every N is the densest automatic cadence "
                             f"(default {AgentOptions.inventory_budget}; 0: exactly every N steps)")
    parser.add_argument("--max-steps", type=int, default=0, metavar="N",
                        help="end the run cleanly after N completed steps (exit 0; 0: no limit)")
    parser.add_argument("--try", dest="try_techniques", action="append", default=[],
                        metavar="TECHNIQUE", help="apply a technique to the unchanged script: "
                        + ", ".join(TECHNIQUES) + " (repeatable; memscope whatif compares)")
    parser.add_argument("--simulate-gpu", metavar="SIZE", default=None,
                        help="on CUDA, cap each device to SIZE (24GiB, 24GB, 16G, 8000MiB) as if "
                             "the GPU were that small")
    parser.add_argument("--redact", action="append", default=[], metavar="PATTERN",
                        help="also store as *** the value of every option whose name matches "
                             "PATTERN, a regular expression searched case-insensitively in the name "
                             "without its dashes (repeatable; the built-in rule already hides "
                             "key, token, secret, password, auth, credential, cookie options and "
                             "URL user:password@)")
    parser.add_argument("--no-redact", action="store_true",
                        help="store the command line exactly as given, secrets included "
                             "(any --redact is then moot)")
    parser.add_argument("--pid", type=int, default=None, metavar="PID",
                        help="attach to a training that is already running (CPython 3.10+ with torch "
                             "imported) instead of starting one; detach with ^C, q, --duration, "
                             "--max-steps or memscope detach PID")
    parser.add_argument("--duration", type=float, default=None, metavar="S",
                        help="with --pid: detach after S seconds of recording")
    parser.add_argument("--debugger", choices=("auto", "gdb", "lldb"), default="auto",
                        help="with --pid on Python before 3.14: the debugger that injects the agent "
                             "(auto: gdb, else lldb; each first tried on a throwaway process)")
    parser.add_argument("--attach-timeout", type=float, default=15.0, metavar="S",
                        help="with --pid: how long to wait for the target's interpreter to run the "
                             "bootstrap (a main thread blocked in a C call); then it is left untouched "
                             "(default %(default)s)")


def agent_options(args: argparse.Namespace) -> tuple[AgentOptions, dict[str, object]]:
    """The agent's options from attach's arguments, and the ones given (not defaults)."""
    chosen = {"sample_hz": args.sample_hz, "nvml_interval": args.nvml_interval,
              "nvml": not args.no_nvml, "layers_every": args.layers_every,
              "layers_first": args.layers_first, "catch_forward_oom": args.catch_forward_oom,
              "max_steps": args.max_steps,
              "try_techniques": [t for w in args.try_techniques for t in w.split(",") if t],
              "simulate_gpu": parse_size(args.simulate_gpu) if args.simulate_gpu else 0,
              "redact": not args.no_redact, "redact_patterns": list(args.redact)}
    # only what was given: an explicit --inventory-every without a budget is kept exactly
    for key in ("inventory_every", "inventory_budget"):
        if getattr(args, key) is not None:
            chosen[key] = getattr(args, key)
    return AgentOptions.from_mapping(chosen), chosen


def split(argv: Sequence[str]) -> tuple[list[str], list[str] | None, bool]:
    """Split attach's own options from the command: everything from the script name, ``-m``
    or ``--`` on belongs to the command, untouched. A script or module runs under this
    memscope's own interpreter, the one whose torch the user installed memscope beside;
    the last value says whether that interpreter was prepended."""
    options: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return options, list(argv[i + 1:]), False
        if token == "-m":
            if i + 1 >= len(argv):
                raise CliError("attach: -m needs a module name")
            return options, [sys.executable, "-m", *argv[i + 1:]], True
        if token.startswith("-") and token != "-":
            options.append(token)
            if token in _TAKES_VALUE and i + 1 < len(argv):
                options.append(argv[i + 1])
                i += 1
            i += 1
            continue
        script = token
        if not os.path.exists(script):
            raise CliError(f"attach: no such script: {script}")
        if os.path.isdir(script) and not os.path.exists(os.path.join(script, "__main__.py")):
            raise CliError(f"attach: {script} is a directory without __main__.py")
        return options, [sys.executable, *argv[i:]], True
    return options, None, False


# Warnings the agent records for the user instead of printing them into the training's output
# (event message prefix -> shown after the run as "memscope: <rest>")
_NOTICE_PREFIXES = ("simulate_gpu: ",)


def agent_notices(reader: RunReader) -> list[str]:
    """The agent's warnings meant for the user, once each (every rank records its own)."""
    out: list[str] = []
    for ev in reader.events("warning"):
        msg = ev.get("message") or ""
        for prefix in _NOTICE_PREFIXES:
            line = f"memscope: {msg[len(prefix):]}"
            if msg.startswith(prefix) and line not in out:
                out.append(line)
    return out


def _import_reading_side() -> None:
    """The modules the end-of-run summary needs, imported while the training starts up (its
    interpreter and torch import are one core's work) rather than before it or after it."""
    import memscope.analysis.summary  # noqa: F401
    import memscope.report.text  # noqa: F401


def _file_gone(db: str, created: tuple[int, int] | None) -> str | None:
    """Whether the run file attach created was deleted or replaced while the training ran."""
    now = file_id(db)
    if now is None:
        return f"the run file {db} was deleted during the run"
    if created is not None and now != created:
        return f"the run file {db} was replaced by another file during the run"
    return None


def _explain_empty(db: str, command: list[str], redaction: Redaction) -> None:
    """No process of the command was recorded: say why in the run file (its recording lines,
    which the summary prints), unless a process already said (a spawned child that trains)."""
    try:
        from memscope.store.reader import RunReader

        with RunReader(db) as reader:
            if reader.processes() or reader.events("agent_missing"):
                return
            without_torch = reader.events(EVENT_TORCH_MISSING)
    except Exception:  # noqa: BLE001 - the summary says what is wrong with the file
        return
    add_event(db, "agent_missing", why_no_agent(command, without_torch), {"command": command},
              redaction=redaction)


def _wait_for_lock(db: str) -> bool:
    """Wait, however long, for another process's lock on the run file to go: the training's
    last rows (in the spill file) and the run's end are written then. ^C gives up (False)."""
    waiting = spill.total_size(db)
    where = f"{db}{spill.SUFFIX}-*"

    def say() -> None:
        rows = f"; {waiting // 1024} KiB of rows wait in {where}" if waiting else ""
        print(f"memscope: the run file {db} is locked by another process (a sqlite3 shell, a "
              f"backup?); waiting for it to write the end of the run{rows} (^C gives up)",
              file=sys.stderr)

    try:
        wait_writable(db, say)
        return True
    except KeyboardInterrupt:
        print(f"memscope: warning: gave up waiting for the lock on {db}; its run still says "
              f"running{' and the rows in ' + where + ' are not in it' if waiting else ''}",
              file=sys.stderr)
        return False


def say_summary(text: str) -> None:
    """The end-of-run summary: its first line is information (``-q`` hides it), the lines after
    it say why the record is incomplete (shown whatever ``-q`` says)."""
    head, *problems = safe_lines(text).split("\n")
    info(head)
    for line in problems:
        print(line, file=sys.stderr)


def main(argv: Sequence[str]) -> int:
    from memscope.cli import _Parser  # the one-line-error parser

    parser = _Parser(prog="memscope attach")
    register(parser)
    add_common(parser)
    option_words, command, via_python = split(argv)
    args = parser.parse_args(option_words)
    set_quiet(args.quiet)
    if args.pid is not None:
        if command is not None:
            raise CliError("attach: give --pid PID or a command to start, not both")
        from memscope.cli import attach_pid

        return attach_pid.run(args)
    for name in ("duration", "debugger", "attach_timeout"):
        if getattr(args, name) != parser.get_default(name):
            raise CliError(f"attach: --{name.replace('_', '-')} goes with --pid")
    if command is None:
        raise CliError("attach: give a script, -m MODULE, -- COMMAND, or --pid PID")
    try:
        options, _chosen = agent_options(args)
        redaction = Redaction.from_options(options)
        command = resolve(command)
    except (ValueError, LaunchError) as exc:
        raise CliError(f"attach: {exc}") from None

    if via_python and command[1:2] == ["-m"]:
        try:
            check_module(command[2])
        except LaunchError as exc:
            raise CliError(f"attach: {exc}") from None
    # As the user would type it: "python train.py ..." for a script, the command as given after --
    shown = ["python", *command[1:]] if via_python else list(command)
    try:
        db, created = new_run(args.db, command, shown, args.force, group_readable=args.group_readable,
                              redaction=redaction)
    except RunFileError as exc:
        storage = storage_problem(args.db or "memscope.db") if "cannot create" in str(exc) else None
        raise CliError(f"{exc}{f' ({storage})' if storage else ''}") from None
    env = child_environment(db, options.to_json(), command)
    if created is not None:
        env[ENV_DB_ID] = f"{created[0]}:{created[1]}"
    # python -I / -E / -S ignore the PYTHONPATH bootstrap: run the script through a small
    # runner that arms the agent, the flags still in force (memscope.runners.isolated)
    child_command, blind = rewrite(command, BOOTSTRAP_DIR)
    if blind is not None:
        print(f"memscope: warning: {blind}", file=sys.stderr)
        add_event(db, "agent_missing", blind, {"command": list(command)}, redaction=redaction)
    # The dashboard in the foreground (a second process on the terminal) while this process
    # supervises the training as it does headless; q closes it and the training goes on.
    foreground = None
    if not args.headless and sys.stdout.isatty() and sys.stdin.isatty():
        from memscope.cli.dashboard_deps import missing
        from memscope.cli.tui import Foreground

        lacking = missing()
        if lacking is None:
            foreground = Foreground(db, args.group_readable)
            env.setdefault("PYTHONUNBUFFERED", "1")  # its output streams to the log, then the terminal
            try:
                foreground.start()
            except (OSError, CliError) as exc:  # (a link or a FIFO planted at RUN.db.log)
                print(f"memscope: {shown_text(str(exc))}; running headless", file=sys.stderr)
                foreground = None
        else:
            print(f"memscope: {lacking}; running headless", file=sys.stderr)
    contained = False
    recorded = True
    try:
        try:
            child = run_child(child_command, env, meanwhile=_import_reading_side)
        except LaunchError as exc:
            discard_run(db, created)  # nothing ran: no run file to leave behind
            raise CliError(f"attach: {exc}") from None
        gone = _file_gone(db, created)
        if gone is not None:  # someone else's file (or none): never write into it
            where = f"the file now at {db} was not touched" if file_id(db) else "nothing was written in its place"
            print(f"memscope: warning: {gone}; this run's record is lost ({where})", file=sys.stderr)
            return child.status
        recorded = _wait_for_lock(db)
        if recorded and child.signal is not None and child.run_status == "killed":
            record_killed(db, child.signal)
        if recorded and blind is None:
            _explain_empty(db, command, redaction)
        storage = storage_problem(db)
        ignored: list[str] = []
        try:
            if recorded:
                contained = finish_run(db, child.exit_code, child.signal, ended=child.ended,
                                       status=child.run_status, storage=storage, ignored=ignored)
        except RunFileError as exc:  # the training's outcome stands; say what is missing
            recorded = False
            why = f" ({storage})" if storage else ""
            print(f"memscope: warning: {exc}{why}; the run file is incomplete", file=sys.stderr)
        if ignored:  # planted beside the run file, or changed since: never replayed
            print("memscope: warning: " + shown_text(f"ignored {len(ignored)} file(s) beside {db} that "
                             f"this run did not make (not replayed): {'; '.join(ignored)}"),
                  file=sys.stderr)
    finally:
        if foreground is not None:
            foreground.stop()  # the dashboard now shows how it ended; wait for the user's q
    if foreground is not None:
        info(f"memscope: the training's output: {foreground.log_path}")
    if not contained:
        compact(db)  # the dashboard held the file open until now, or the disk was full

    try:
        from memscope.analysis.summary import headline
        from memscope.report.text import render_headless
        from memscope.store.reader import RunReader

        with RunReader(db) as reader:
            for line in agent_notices(reader):
                print(safe_lines(line), file=sys.stderr)
            summary = headline(reader)
        if not recorded:  # the file still says running: it is this process's word that counts
            summary.status = f"{child.run_status} (not in the run file)"
        say_summary(render_headless(summary))
    except Exception as exc:  # noqa: BLE001 - the training's exit status must come out, whatever
        print(f"memscope: warning: cannot summarise the run: {' '.join(str(exc).split())}",
              file=sys.stderr)
    if not args.headless and sys.stdout.isatty():
        info(f"memscope: explore it with: memscope report {db}")
    return child.status

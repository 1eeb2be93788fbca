"""The output samples of README.md and docs/*.md, rerun from real runs.

A sample is a fenced block right after a marker comment::

    <!-- sample: GROUP [head=N] [grep=REGEX] [cut=N] -->
    ```text
    $ memscope report run.db
    ...the output...
    ```

Each ``$ COMMAND`` line (``\\`` continues it on the next line) is run with bash in a temporary
directory of the group, after the group's setup commands (``GROUPS`` below); the lines after it,
up to the next ``$`` or the end of the block, are its output (stdout and stderr, as a terminal
shows them). Every group
is set up once and all its blocks are checked against that one run. The working directory holds
links to ``examples/`` and ``tests/``, so commands are written as a user in the repository root
writes them, and the run files land in the temporary directory. In the output, the repository's
and the temporary directory's absolute paths are printed relative.

Options shorten what the block keeps of the output: ``grep`` keeps the lines that match (a line
``...`` stands for each run of lines left out), ``head`` the first N lines (then ``...``), ``cut``
cuts longer lines at a word boundary and ends them with ``...``. The comparison is exact after
these options and after masking the numbers that vary from run to run (``VOLATILE``: each says
why); everything else (words, columns, byte counts, steps, verdicts) must be what the program
prints. ``python tests/test_readme_samples.py --update`` rewrites every sample from fresh runs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- sample: (\S+)((?:\s+\w+=\S+)*)\s*-->$")


@dataclass(frozen=True)
class Shared:
    """A setup run that other tests make too: ``memscope attach --headless --db DB OPTIONS SCRIPT
    ARGS`` (``ddp``: ``-- torchrun`` with 2 ranks on loopback before ``tests/scripts/ddp.py ARGS``).
    Under pytest the session's run of the same command (tests/shared_runs.py) is copied to DB
    instead of a run of its own; ``copies``: more names the same file is copied to."""
    db: str
    command: tuple[str, ...]  # the script and its arguments; with ddp, ddp.py's arguments
    options: tuple[str, ...] = ()
    ddp: bool = False
    copies: tuple[str, ...] = ()
    fails: bool = False  # the run ends in an error (attach's exit status is the training's)

    def shell(self) -> str:
        if self.ddp:
            line = (f"memscope attach --headless --db {self.db} -- torchrun --nproc-per-node 2 --master-addr "
                    f"127.0.0.1 --master-port $PORT tests/scripts/ddp.py {shlex.join(self.command)}")
        else:
            line = f"memscope attach --headless --db {self.db} {shlex.join([*self.options, *self.command])}"
        if self.fails:
            line += " || true"
        return " && ".join([line, *(f"cp {self.db} {c}" for c in self.copies)])


DIFF_GPT = ("examples/tiny_gpt.py", "--steps", "8", "--batch", "16", "--seq", "128", "--layers", "4")

# What each group runs before its samples (bash, in the group's directory). The sample blocks
# of a group read what these wrote.
GROUPS: dict[str, list[str | Shared]] = {
    "tiny_gpt": ["memscope attach --headless --db run.db examples/tiny_gpt.py --steps 30"],
    # b.db: a second file of the same run (merge refuses the pair on a.db)
    "short": [Shared("a.db", ("examples/tiny_gpt.py", "--steps", "4"), copies=("b.db",)),
              "python tests/doc_samples.py damage a.db damaged.db nolayers.db"],
    "leaky": [Shared("run.db", ("examples/leaky.py", "--steps", "40"))],  # tests/test_reader_aggregates.py's
    # the runs tests/test_leaks.py (total_loss) and tests/test_leak_growth.py read
    "total_loss": [Shared("run.db", ("examples/leaks/total_loss.py", "--steps", "40"))],
    "numpy_history": [Shared("run.db", ("examples/leaks/numpy_history.py", "--steps", "20"))],
    "workers": [Shared("run.db", ("examples/leaks/dataloader_workers.py", "--rows", "40000", "--epochs", "4"))],
    "compile": ["memscope attach --headless --db compile.db tests/compat/cases/compile.py out.pt submodule"],
    "ckpt": ["memscope attach --headless --db ckpt.db tests/compat/cases/checkpointing.py out.pt"],
    "accumulate": [Shared("acc.db", ("tests/scripts/accumulate.py", "16,64,32,8"))],
    "oom": ["(ulimit -v 2800000; memscope attach --headless --db repro.db examples/double_batch.py) || true"],
    "diff": [Shared("plain.db", DIFF_GPT), Shared("ckpt.db", (*DIFF_GPT, "--checkpoint"))],  # tests/test_diff.py's
    "whatif": [],
    "estimate": [],
    "fit": [],
    "ranks": [Shared("run.db", ("--steps", "6", "--heavy-rank", "1", "--heavy-mb", "200"), ddp=True),
              Shared("oom.db", ("--steps", "5", "--oom-rank", "1", "--oom-step", "2"), ddp=True, fails=True)],
}

# The numbers that differ between two runs of the same command, masked before comparing. Each
# pattern is narrow: a byte count, a step or a verdict elsewhere on the line still has to match.
VOLATILE: list[tuple[str, re.Pattern[str]]] = [
    # a temporary directory's name: first, whole (a random name ending in "8s" is no duration)
    ("TMP", re.compile(r"/tmp/[\w.-]+")),
    # when the run happened
    ("DATE", re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?")),
    # wall time: any duration, step time or rate in time units
    ("TIME", re.compile(r"[-+]?\d+(?:\.\d+)? ?(?:ms|s)\b")),
    # the forward ms / backward ms columns of a layers table (the last column, calls, is kept)
    ("TIME", re.compile(r"(?:\d+\.\d\d|-)\s+(?:\d+\.\d\d|-)(?=\s+\d+$)")),
    # how many memory samples the sampler thread took (a timer, not the program)
    ("N", re.compile(r"(?<=^samples   )\d+")),
    # host RSS holds the interpreter, torch and the C allocator's cache: it moves by MiBs
    ("RSS", re.compile(r"[\d.]+ [KMGT]?i?B(?= host RSS)|(?<=host RSS at step )\d+|(?<=peak's step )\d+"
                       r"|(?<= · other )[\d.]+ [KMGT]?i?B|(?<=^ {2}other {14})[\d.]+ [KMGT]?i?B")),
    # the process's virtual size moves with the interpreter's and torch's mappings, as RSS does
    ("VMS", re.compile(r"(?<=virtual size )[\d.]+ [KMGT]?i?B")),
    # ... and the limit line's sum with the request, and how far that is over or under the limit
    ("VMS", re.compile(r"(?<= = )[\d.]+ [KMGT]?i?B(?=, (?:over it by|[\d.]+ [KMGT]?i?B under it))"
                       r"|(?<=over it by )[\d.]+ [KMGT]?i?B|[\d.]+ [KMGT]?i?B(?= under it by these figures)")),
    # the machine's memory, and its RSS-derived share
    ("MACHINE", re.compile(r"\d+% of the machine's [\d.]+ [KMGT]?i?B")),
    # rows of `memscope diff` that are host RSS or wall time through and through
    ("RSS", re.compile(r"(?<=^  peak \(host RSS\)).*|(?<=^    other ).*|(?<=^  median step ).*")),
    # a ranks table: peaks are host RSS (and the step it peaked at), the host is the machine's
    ("RSS", re.compile(r"(?<=imbalance )[\d.]+%|(?<=rank \d )[\d.]+ [KMGT]?i?B")),
    (r"\1<HOST>\2<RSS> <RSS> <TIME>",
     re.compile(r"^(\s+\d+\s+\d+\s+)\S+(\s+\d+\s+)[\d.]+ [KMGT]?i?B\s+\d+\s+\d+(?=\s+\w+)")),
    # whatif's last column: the host RSS peak's change, shown for reference
    ("RSS", re.compile(r"-?[\d.]+ [KMGT]?i?B \(-?\d+%\)$")),
    # DataLoader workers' private memory (USS) and how fast it grew: timing and the kernel's
    ("USS", re.compile(r"(?<=copied )[\d.]+ [KMGT]?i?B|\([\d.]+ [KMGT]?i?B → .* USS in .*/step\)")),
    # growth outside tensors measured on host RSS
    ("RSS", re.compile(r"(?<=^GROWTH host RSS )[-+][\d.]+ [KMGT]?i?B")),
    # ... and on host memory in use: the arrays' 256 KiB a step and the interpreter's allocations
    # around them, 260-268 KiB a step from run to run (test_leak_growth checks the range)
    ("IN-USE", re.compile(r"(?<=^GROWTH host memory in use )[-+][\d.]+ [KMGT]?i?B")),
    # whether the profiled step is the host RSS peak's step: the RSS peak of a short run lands on
    # step 1 or 2 depending on the machine's load (the breakdown is the profiled step's either way)
    ("BREAKDOWN-STEP", re.compile(r"\(measured at (?:profiled )?step \d+, (?:the peak's step|not at the peak's step "
                                  r"(?:<RSS>|\d+))\)")),
]


# Lines whose presence depends on the machine, not the program: host RSS above every step's peak
# (the interpreter's start-up or shutdown on this machine). Left out on both sides.
OPTIONAL = [re.compile(r"at most over the whole run, outside the steps")]


def mask(line: str) -> str:
    for name, pattern in VOLATILE:
        line = pattern.sub(name if "<" in name else f"<{name}>", line)
    return " ".join(line.split())  # a masked number's width moves the columns


@dataclass
class Block:
    path: Path
    open: int  # index of the opening fence line
    close: int  # index of the closing fence line
    group: str
    options: dict[str, str]
    commands: list[tuple[str, list[str]]] = field(default_factory=list)  # (command, shown output)

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.open + 1}"


def parse(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            raise ValueError(f"{path.name}:{i + 1}: a sample marker must be followed by a fenced block")
        close = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        options = dict(kv.split("=", 1) for kv in m.group(2).split())
        block = Block(path, i + 1, close, m.group(1), options)
        body = lines[i + 2:close]
        k = 0
        while k < len(body):
            if not body[k].startswith("$ "):
                raise ValueError(f"{block.where()}: a sample starts with its `$ command` line")
            command = body[k][2:]
            while command.endswith("\\"):
                k += 1
                command = command[:-1] + " " + body[k].strip()
            k += 1
            out = []
            while k < len(body) and not body[k].startswith("$ "):
                out.append(body[k])
                k += 1
            block.commands.append((" ".join(command.split()), out))
        blocks.append(block)
    return blocks


def all_blocks() -> list[Block]:
    return [b for path in DOCS for b in parse(path)]


def shown(output: str, options: dict[str, str]) -> list[str]:
    """The part of the output a block with these options keeps."""
    lines = output.rstrip("\n").splitlines()
    if "grep" in options:
        keep = re.compile(options["grep"])
        kept: list[str] = []
        for line in lines:
            if keep.search(line):
                kept.append(line)
            elif not kept or kept[-1] != "...":
                kept.append("...")
        lines = kept
    if "head" in options and len(lines) > int(options["head"]):
        lines = lines[:int(options["head"])] + ["..."]
    if "cut" in options:
        width = int(options["cut"])
        lines = [ln if len(ln) <= width else ln[:ln.rfind(" ", 0, width)] + " ..." for ln in lines]
    return lines


def differences(want: list[str], got: list[str]) -> list[str]:
    """Lines that differ after masking (empty: the sample is what the program prints)."""
    want = [ln for ln in want if not any(p.search(ln) for p in OPTIONAL)]
    got = [ln for ln in got if not any(p.search(ln) for p in OPTIONAL)]
    problems = []
    for k in range(max(len(want), len(got))):
        w = mask(want[k]) if k < len(want) else "<missing>"
        g = mask(got[k]) if k < len(got) else "<missing>"
        if w.endswith(" ...") or g.endswith(" ..."):  # cut (where depends on masked widths)
            w, g = w.removesuffix(" ..."), g.removesuffix(" ...")
            n = min(len(w), len(g))
            w, g = w[:n], g[:n]
        if w != g:
            problems.append(f"line {k + 1}:\n  docs: {w}\n  now:  {g}")
    return problems


class Workspace:
    """A group's directory: links to the repository's examples and tests, a `memscope` on PATH."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="memscope-samples-")
        self.dir = Path(self._tmp.name)
        for name in ("examples", "tests"):
            (self.dir / name).symlink_to(ROOT / name)
        bin_dir = self.dir / ".bin"
        bin_dir.mkdir()
        for tool, module in (("memscope", "memscope"), ("python", None)):
            args = f"-m {module} " if module else ""
            (bin_dir / tool).write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {args}"$@"\n')
            (bin_dir / tool).chmod(0o755)
        path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.env = dict(os.environ, PATH=path, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tui")]))
        self.env.pop("MEMSCOPE_DB", None)

    def run(self, command: str, timeout: float = 600) -> str:
        env = dict(self.env, PORT=str(_free_port()))
        # one stream, unbuffered: stdout and stderr lines in the order a terminal shows them
        res = subprocess.run(["bash", "-c", command], cwd=self.dir, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=timeout)
        out = res.stdout
        for prefix in (str(self.dir.resolve()), str(self.dir), str(ROOT)):
            out = out.replace(prefix + "/", "").replace(prefix, ".")
        return out

    def close(self) -> None:
        self._tmp.cleanup()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_group(group: str, blocks: list[Block], shared: Callable[[Shared], Path] | None = None
              ) -> dict[tuple[int, int], list[str]]:
    """Set the group up once, run every command of its blocks: (block, command) -> shown output.
    ``shared``: where the test session's run of a :class:`Shared` setup is (copied in, not rerun).
    A command shown in several blocks (README.md and a page of docs/) is run once, each block
    checked against that output with its own options: every sampled command reads the group's
    files without changing them (`merge`, `whatif` write new ones), so a second run prints the
    same (README's `fit` sample, also in docs/plan.md, is ~20 s of fake runs)."""
    ws = Workspace()
    try:
        for command in GROUPS[group]:
            if isinstance(command, Shared) and shared is not None:
                for name in (command.db, *command.copies):
                    shutil.copyfile(shared(command), ws.dir / name)
            else:
                ws.run(command.shell() if isinstance(command, Shared) else command)
        printed: dict[str, str] = {}
        results = {}
        for b, block in enumerate(blocks):
            for c, (command, _) in enumerate(block.commands):
                if command not in printed:
                    printed[command] = ws.run(command)
                results[(b, c)] = shown(printed[command], block.options)
        return results
    finally:
        ws.close()


# make test's two workers each take whole files: the groups rerun by tests/test_readme_samples_more.py
# (the others by tests/test_readme_samples.py), chosen so the halves take about equal time (in the
# last full make test: oom, whatif, ranks, tiny_gpt, ckpt, short, total_loss, accumulate ~61 s; these
# ~62 s, fit's command run once instead of twice: 44 -> ~22 s)
SECOND_FILE = {"fit", "leaky", "diff", "workers", "numpy_history", "compile", "estimate"}


def stale(group: str, blocks: list[Block], shared: Callable[[Shared], Path] | None = None) -> list[str]:
    """The group's samples that differ from what the program prints now, each said with its
    place, its command, the first differences and the whole output."""
    members = [b for b in blocks if b.group == group]
    results = run_group(group, members, shared)
    problems = []
    for b, block in enumerate(members):
        for c, (command, want) in enumerate(block.commands):
            diff = differences(want, results[(b, c)])
            if diff:
                got = "\n".join(results[(b, c)])
                problems.append(f"{block.where()}: $ {command}\n" + "\n".join(diff[:5]) + f"\n--- output:\n{got}")
    return problems


def _key(block: Block) -> tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]:
    return block.group, tuple(c for c, _ in block.commands), tuple(sorted(block.options.items()))


def update(groups: list[str] | None = None) -> None:
    """Rewrite the samples (all, or those of the named groups) with fresh output."""
    by_group: dict[str, list[Block]] = {}
    for block in all_blocks():
        if not groups or block.group in groups:
            by_group.setdefault(block.group, []).append(block)
    fresh: dict[tuple[object, ...], list[str]] = {}
    for group, members in by_group.items():
        print(f"{group}: {len(members)} sample(s)", flush=True)
        results = run_group(group, members)
        for b, block in enumerate(members):
            body = []
            for c, (command, _) in enumerate(block.commands):
                body.append("$ " + command)
                body.extend(results[(b, c)])
            fresh[_key(block)] = body
    for path in DOCS:  # read again: the files may have been edited while the runs went on
        lines = path.read_text().splitlines()
        for block in sorted(parse(path), key=lambda b: -b.open):
            if _key(block) in fresh:
                lines[block.open + 1:block.close] = fresh[_key(block)]
        path.write_text("\n".join(lines) + "\n")


def damage(source: str, damaged: str, nolayers: str) -> None:
    """Two damaged copies of a run file, for the samples of the run-file page."""
    import sqlite3

    for target in (damaged, nolayers):
        shutil.copy(source, target)
    with sqlite3.connect(damaged) as con:
        con.execute("UPDATE steps SET start = 'abc' WHERE step = 1")
    with sqlite3.connect(nolayers) as con:
        con.execute("DROP TABLE layer_stats")


if __name__ == "__main__":
    if sys.argv[1:2] == ["damage"]:
        damage(*sys.argv[2:5])
    else:
        sys.exit("usage: python tests/test_readme_samples.py --update [GROUP ...]")

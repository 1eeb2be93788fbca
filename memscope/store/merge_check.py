"""Are these run files the nodes of one distributed job? ``memscope merge`` asks before it writes.

Two unrelated runs merged would read as one multi-rank run with an invented imbalance, so by
default the inputs must show they belong together: every input has ranked processes (a launcher
set RANK and WORLD_SIZE), all say the same world size, each global rank lives in one file only,
the ranks ran the same program (the node's launcher command differs by ``--node-rank`` and is not
compared), and the runs overlap in time (rendezvous keeps the nodes of one job alive together;
a few seconds' slack covers hosts whose clocks disagree a little).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from memscope.store.reader import RunReader
from memscope.store.schema import RunFileError

# hosts' clocks may disagree a little; a larger gap is two jobs, one after the other
CLOCK_SLACK_S = 10.0
_LOCAL_RANK = re.compile(r"--local[-_]rank(=.*)?$")


class NotOneJob(RunFileError):
    """The inputs are readable run files, but not the ranks of one job (the caller may override)."""


def check_distinct_ranks(readers: list[RunReader]) -> None:
    """Two nodes of one run never share a global rank: refuse files that are not one run."""
    owner: dict[int, str] = {}
    for r in readers:
        for p in r.processes():
            rank = p["rank"]
            if rank is None:
                continue
            if rank in owner and owner[rank] != r.path:
                raise RunFileError(f"rank {rank} is in both {owner[rank]} and {r.path}: "
                                   "these are not the nodes of one run")
            owner[rank] = r.path


def check_one_job(readers: list[RunReader]) -> list[int]:
    """Raise NotOneJob (one line) unless the inputs are ranks of one job; return the ranks of
    that job's world that no input holds (merging some of the nodes is allowed)."""
    ranked = {r.path: [p for p in r.processes() if p["rank"] is not None] for r in readers}
    for r in readers:
        if not ranked[r.path]:
            raise NotOneJob(f"{r.path} has no ranked process (no RANK/WORLD_SIZE from torchrun or "
                            "another launcher)")
    sizes: dict[int, str] = {}
    for r in readers:
        for p in ranked[r.path]:
            size = p["world_size"]
            if size is None:
                raise NotOneJob(f"{r.path}: rank {p['rank']} has no world size")
            if p["rank"] < 0 or p["rank"] >= size:
                raise NotOneJob(f"{r.path}: rank {p['rank']} is outside its world of {size}")
            sizes.setdefault(size, r.path)
    if len(sizes) > 1:
        detail = ", ".join(f"{path}: {size}" for size, path in sizes.items())
        raise NotOneJob(f"the inputs say different world sizes ({detail})")
    _check_same_program(readers, ranked)
    _check_overlap(readers)
    world = next(iter(sizes))
    held = {p["rank"] for procs in ranked.values() for p in procs}
    return [k for k in range(world) if k not in held]


def _check_same_program(readers: list[RunReader], ranked: dict[str, list[dict[str, Any]]]) -> None:
    first: tuple[str, set[tuple[str, ...]]] | None = None
    for r in readers:
        programs = {_program(p["argv"]) for p in ranked[r.path]}
        if first is None:
            first = (r.path, programs)
        elif programs != first[1]:
            raise NotOneJob(f"{first[0]} and {r.path} ran different commands "
                            f"({_show(first[1])} vs {_show(programs)})")


def _program(argv: list[str]) -> tuple[str, ...]:
    """A rank's command line without what a launcher varies per rank (legacy ``--local-rank``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        m = _LOCAL_RANK.match(arg)
        if m:
            skip = m.group(1) is None  # "--local-rank N": drop N too
            continue
        out.append(arg)
    return tuple(out)


def _show(programs: set[tuple[str, ...]]) -> str:
    return " | ".join(sorted(shlex.join(p) or "?" for p in programs))


def _check_overlap(readers: list[RunReader]) -> None:
    spans = []
    for r in readers:
        run = r.run()
        if run is None:
            continue  # the merge itself says "no run row" when none has one
        end = run["ended"]
        if end is None:  # unfinished: until the last sign of a writer
            end = r.last_activity()
        spans.append((r.path, float(run["started"]), float("inf") if end is None else float(end)))
    if len(spans) < 2:
        return
    late = max(spans, key=lambda s: s[1])
    early = min(spans, key=lambda s: s[2])
    gap = late[1] - early[2]
    if gap > CLOCK_SLACK_S:
        raise NotOneJob(f"{late[0]} started {gap:.0f} s after {early[0]} ended (they did not "
                        "overlap in time, unless the hosts' clocks disagree by that much)")

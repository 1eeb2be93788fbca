"""``memscope oom RUN.db``: the out-of-memory post-mortem, in plain words."""

from __future__ import annotations

import argparse
import json

from memscope.analysis.oom import ABSURD_REQUEST, OomReport, advice, post_mortem
from memscope.analysis.suggestions import suggest
from memscope.units import human_bytes
from memscope.store.reader import RunReader

HELP = "explain an out-of-memory failure (or a kill) recorded in a run file"
TOP_SUGGESTIONS = 3


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", metavar="RUN.db", help="run file written by memscope attach or import")
    parser.add_argument("--json", action="store_true", help="print the post-mortem as JSON")


def run(args: argparse.Namespace) -> int:
    with RunReader(args.db) as reader:
        report = post_mortem(reader)
        # what the measurements say would have saved the most (memscope.analysis.suggestions)
        tips = suggest(reader)[:TOP_SUGGESTIONS] if _memory_bound(report) else []
    if args.json:
        print(json.dumps(None if report is None else {**report.to_json(), "kind": report.kind,
                                                      "details": report.data,
                                                      "suggestions": [t.as_json() for t in tips]},
                         indent=2))
        return 0
    if report is None:
        print("no out-of-memory in this run")
        return 0
    print(render(report))
    if tips:
        print("measured  techniques ranked by estimated saving (memscope report RUN.db for more)")
        for t in tips:
            print(f"          {t.technique}: about {human_bytes(t.estimated_saving_bytes)} · {t.how}")
    return 0


def _memory_bound(r: OomReport | None) -> bool:
    """Whether saving memory is the answer: not for a shape bug or a kill from outside."""
    if r is None:
        return False
    if r.kind == "killed":
        return bool(r.data.get("likely_oom_killer"))
    return r.requested_bytes is None or r.requested_bytes <= ABSURD_REQUEST


def render(r: OomReport) -> str:
    d = r.data
    if r.kind == "killed":
        lines = [f"what      {r.message}"]
        if r.step is not None:
            lines.append(f"where     during step {r.step} (the step in progress at the last sample)")
        mem = f"last sample: host RSS {human_bytes(d.get('last_rss'))}"
        if d.get("host_total_bytes"):
            mem += f" of {human_bytes(d['host_total_bytes'])} on this machine"
            if d.get("last_rss") is not None:
                mem += f" ({100 * d['last_rss'] / d['host_total_bytes']:.0f}%)"
        if d.get("last_allocated") is not None:
            mem += f", CUDA allocated {human_bytes(d['last_allocated'])}"
        lines.append(f"memory    {mem}")
        if not d.get("likely_oom_killer"):
            lines.append("          memory was not near the machine's total: probably not the OOM killer")
    else:
        lines = [f"what      out of memory: {r.message}"]
        where = f"step {r.step}" if r.step is not None else "outside any step"
        where += f", {r.phase}"
        if r.module is not None:
            mtype = f" ({d['module_type']})" if d.get("module_type") else ""
            where += f", in module {r.module or '(the model itself)'}{mtype}"
        stack = [n if n else "(model)" for n in (d.get("module_stack") or []) if n is not None]
        lines.append(f"where     {where}")
        if len(stack) > 1:
            lines.append(f"          module path: {' > '.join(stack)}")
        device = d.get("device") or "cpu"
        live_name = "host RSS" if device == "cpu" else "allocated"
        exact = "" if d.get("requested_exact", True) else " (rounded, from the message)"
        lines.append(f"memory    requested {human_bytes(r.requested_bytes)}{exact}"
                     f" with {human_bytes(r.live_bytes)} {live_name} on {device}")
        full = []
        if d.get("reserved_bytes") is not None:
            full.append(f"reserved {human_bytes(d['reserved_bytes'])}")
        if d.get("device_free_bytes") is not None:
            free = f"device free {human_bytes(d['device_free_bytes'])}"
            if d.get("device_total_bytes"):
                free += f" of {human_bytes(d['device_total_bytes'])}"
            full.append(free)
        if device == "cpu" and d.get("host_total_bytes") and r.live_bytes is not None:
            full.append(f"{100 * r.live_bytes / d['host_total_bytes']:.0f}% of the machine's "
                        f"{human_bytes(d['host_total_bytes'])}")
        if full:
            lines.append("          " + " · ".join(full))
        bd = d.get("breakdown")
        if isinstance(bd, dict):
            parts = [f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in bd.items()
                     if k != "step" and v is not None]
            lines.append(f"breakdown at profiled step {bd.get('step')}: " + " · ".join(parts))
        if r.others:
            lines.append(f"          ({r.others} more out-of-memory error(s) later in the run)")
    tips = advice(r)
    lines.append("change    " + tips[0])
    lines.extend("          " + t for t in tips[1:])
    return "\n".join(lines)

"""``memscope oom RUN.db``: the out-of-memory post-mortem, in plain words."""

from __future__ import annotations

import argparse
import json

from memscope.analysis.oom import ABSURD_REQUEST, OomReport, facts, post_mortem, render
from memscope.analysis.suggestions import suggest
from memscope.store.reader import RunReader
from memscope.display import shown, shown_text
from memscope.units import human_bytes

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
    print(render(facts(report)))
    if tips:
        print("measured  techniques ranked by estimated saving (memscope report RUN.db for more)")
        for t in tips:
            saving = human_bytes(t.estimated_saving_bytes)
            print(f"          {shown(t.technique)}: about {saving} · {shown_text(t.how)}")
            print(f"            why: {shown_text(t.evidence)}")
    return 0


def _memory_bound(r: OomReport | None) -> bool:
    """Whether saving memory is the answer: not for a shape bug or a kill from outside."""
    if r is None:
        return False
    if r.kind == "killed":
        return bool(r.data.get("likely_oom_killer"))
    return r.requested_bytes is None or r.requested_bytes <= ABSURD_REQUEST

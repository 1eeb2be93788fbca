"""``memscope diff A.db B.db [--json]``: two runs side by side (B compared to A)."""

from __future__ import annotations

import argparse
import json
from typing import Callable

from memscope.display import shown, shown_text
from memscope.analysis.diff import Delta, RunDiff, diff_runs, to_json
from memscope.analysis.summary import summarize
from memscope.units import human_bytes
from memscope.store.reader import RunReader

HELP = "compare two runs: peak, breakdown, per-layer activations, step time, leaks"
_LAYERS = 10


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A.db", help="the baseline run file")
    parser.add_argument("b", metavar="B.db", help="the run file to compare with it")
    parser.add_argument("--json", action="store_true", help="print the memscope.diff/1 JSON document")


def run(args: argparse.Namespace) -> int:
    with RunReader(args.a) as ra, RunReader(args.b) as rb:
        d = diff_runs(summarize(ra), summarize(rb))
    if args.json:
        print(json.dumps(to_json(d), indent=2))
    else:
        print(render(d))
    return 0


def render(d: RunDiff) -> str:
    rows: list[list[str]] = [["", "A", "B", "B - A", "B / A"]]

    def add(name: str, v: Delta, fmt: str = "bytes") -> None:
        f = _FORMATS[fmt]
        rows.append([name, f(v.a), f(v.b), _signed(v.delta, f), _ratio(v.ratio)])

    add(f"peak ({_metric(d.metric[0])})" if d.same_metric else "peak", d.peak)
    for k, v in d.breakdown.items():
        add("  " + k.replace("_", " "), v)
    add("activations (layers)", d.activations_total)
    add("steps", d.steps, "count")
    add("median step", d.median_step_s, "seconds")
    add("leak growth / step", d.leak_bytes_per_step)
    for rank, v in d.rank_peaks.items():
        add(f"rank {rank} peak", v)
    lines = [f"A  {shown_text(d.a)}", f"B  {shown_text(d.b)}"]
    if not d.same_metric:
        lines.append(f"note: the peaks measure different things (A: {_metric(d.metric[0])}, "
                     f"B: {_metric(d.metric[1])}); compare them with care")
    lines.append(_table(rows))
    missing = [side for side, st in (("A", d.layer_step.a), ("B", d.layer_step.b)) if st is None]
    if missing:
        lines.append(f"note: {' and '.join(missing)} has no profiled step: no per-layer comparison"
                     " (attach with --layers-every N)")
    changed = [x for x in d.layers if x.bytes.delta]
    if changed:
        lines.append(f"layers  activations saved for backward (profiled steps {d.layer_step.a} / "
                     f"{d.layer_step.b}), largest changes first")
        lrows = [["module", "type", "A", "B", "B - A"]]
        for x in changed[:_LAYERS]:
            lrows.append([shown(x.module) or "(model)", shown(x.type) or "-", human_bytes(x.bytes.a),
                          human_bytes(x.bytes.b), _signed(x.bytes.delta, human_bytes)])
        lines.append(_table(lrows, left=2))
        if len(changed) > _LAYERS:
            lines.append(f"  ... {len(changed) - _LAYERS} more changed modules (--json lists all)")
    for lk in d.leaks:
        what = shown_text(f"{lk.category} {lk.dtype} {lk.shape}" + (f" {lk.grad_fn}" if lk.grad_fn else ""))
        side = ("fixed in B" if lk.bytes_per_step.b is None else
                "new in B" if lk.bytes_per_step.a is None else "in both")
        lines.append(f"leak    {what}: A {_per_step(lk.bytes_per_step.a)}, "
                     f"B {_per_step(lk.bytes_per_step.b)} ({side})")
    return "\n".join(lines)


def _metric(m: str) -> str:
    return {"rss": "host RSS", "cuda_allocated": "CUDA allocated"}.get(m, m)


def _per_step(v: float | None) -> str:
    return "no leak" if v is None else f"+{human_bytes(v)}/step"


def _bytes(v: float | None) -> str:
    return human_bytes(v)


def _count(v: float | None) -> str:
    return "-" if v is None else str(int(v))


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


_FORMATS = {"bytes": _bytes, "count": _count, "seconds": _seconds}


def _signed(v: float | None, f: Callable[[float | None], str]) -> str:
    if v is None:
        return "-"
    text = f(abs(v))
    return ("+" if v > 0 else "-" if v < 0 else "") + text


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _table(rows: list[list[str]], left: int = 1) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  " + "  ".join(cells).rstrip())
    return "\n".join(out)

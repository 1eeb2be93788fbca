"""``memscope report``: the run in a few plain lines."""

from __future__ import annotations

import shlex

from memscope.analysis.hotspots import Hotspot
from memscope.analysis.summary import RunSummary
from memscope.report.format import clock, human_bytes

_METRIC = {"rss": "host RSS", "cuda_allocated": "CUDA allocated"}


def render_summary(s: RunSummary) -> str:
    if s.signal is not None:
        ending = f"{s.status}, signal {s.signal}"
    elif s.exit_code is not None:
        ending = f"{s.status}, exit {s.exit_code}"
    else:
        ending = s.status
    duration = f" ({s.ended - s.started:.1f} s)" if s.started and s.ended else ""
    lines = [
        f"run       {shlex.join(s.command)}",
        f"status    {ending}",
        f"device    {s.device} · torch {s.torch or '?'} · {len(s.processes)} process(es)",
        f"time      {clock(s.started)} → {clock(s.ended) if s.ended else 'still running'}{duration}",
    ]
    step_line = f"steps     {s.steps} completed"
    if s.step_mode:
        step_line += f" (boundaries: {s.step_mode})"
    if s.median_step_s is not None:
        step_line += f", median {s.median_step_s * 1000:.0f} ms/step"
    lines.append(step_line)
    lines.append(f"samples   {s.samples}" + (f" ({s.dropped} dropped)" if s.dropped else ""))
    if s.peak.bytes is None:
        lines.append("peak      -")
    else:
        where = f"at step {s.peak.step}" if s.peak.step is not None else "outside any step"
        lines.append(f"peak      {human_bytes(s.peak.bytes)} {_METRIC.get(s.peak.metric, s.peak.metric)} {where}")
        if s.peak.whole_run_bytes and s.peak.whole_run_bytes > s.peak.bytes:
            lines.append(f"          {human_bytes(s.peak.whole_run_bytes)} at most over the whole run, "
                         "outside the steps (start-up, evaluation, shutdown)")
    if s.peak.breakdown:
        bd = s.peak.breakdown
        lines.append("breakdown " + " · ".join(f"{k.replace('_', ' ')} {human_bytes(v)}"
                                               for k, v in bd.items()))
    if s.oom is not None and s.oom.kind == "oom":
        where = ", ".join(x for x in (s.oom.phase, s.oom.module) if x)
        at = f"at step {s.oom.step}" if s.oom.step is not None else "outside any step"
        lines.append(f"oom       out of memory {at} ({where}), requested "
                     f"{human_bytes(s.oom.requested_bytes)} (memscope oom RUN.db explains it)")
    if s.hotspots:
        lines.append(f"hotspots  activations saved for backward, profiled step {s.hotspot_step}"
                     " (memscope layers RUN.db for all modules)")
        lines.append(render_hotspots(s.hotspots[:_TOP], with_details=False, indent="  "))
    for lk in s.leaks[:3]:
        what = f"{lk.category} {lk.dtype} {lk.shape}" + (f" {lk.grad_fn}" if lk.grad_fn else "")
        lines.append(f"leak      {what} +{human_bytes(lk.bytes_per_step)}/step, held by "
                     f"{lk.held_by or 'unknown'} (memscope leaks RUN.db)")
    return "\n".join(lines)


_TOP = 8


def render_hotspots(spots: list[Hotspot], with_details: bool = True, indent: str = "") -> str:
    """A table of hotspots: module, type, activation bytes, share (and output bytes, forward ms)."""
    head = ["module", "type", "activations", "share"]
    if with_details:
        head += ["outputs", "forward ms", "calls"]
    table = [head]
    for h in spots:
        row = [h.module or "(model)", h.type or "-", human_bytes(h.activation_bytes), f"{h.share * 100:.1f}%"]
        if with_details:
            row += [human_bytes(h.output_bytes), f"{h.forward_s * 1000:.2f}", str(h.calls)]
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    out = []
    for r in table:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append(indent + "  ".join(cells).rstrip())
    return "\n".join(out)


def render_headless(s: RunSummary) -> str:
    peak = human_bytes(s.peak.bytes) if s.peak.bytes is not None else "-"
    step = f" at step {s.peak.step}" if s.peak.step is not None else ""
    return (f"memscope: {s.path} · {s.steps} steps · peak {peak} "
            f"{_METRIC.get(s.peak.metric, s.peak.metric)}{step} · {s.status}")

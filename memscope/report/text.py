"""``memscope report``: the run in a few plain lines."""

from __future__ import annotations

import shlex

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
    return "\n".join(lines)


def render_headless(s: RunSummary) -> str:
    peak = human_bytes(s.peak.bytes) if s.peak.bytes is not None else "-"
    step = f" at step {s.peak.step}" if s.peak.step is not None else ""
    return (f"memscope: {s.path} · {s.steps} steps · peak {peak} "
            f"{_METRIC.get(s.peak.metric, s.peak.metric)}{step} · {s.status}")

"""``memscope report``: the run in a few plain lines."""

from __future__ import annotations

import shlex

from memscope.analysis.oom import ABSURD_REQUEST
from memscope.analysis.oom_limits import limit_line
from memscope.analysis.hotspots import Hotspot, compiled_note, micro_batch_note
from memscope.analysis.leaks import describe
from memscope.analysis.ranks import RankSummary, heaviest, imbalance, lightest
from memscope.analysis.suggestions import Suggestion, suggest_for
from memscope.analysis.summary import Headline, RunSummary
from memscope.display import shown, shown_text
from memscope.report.format import breakdown_source, clock, command_hint
from memscope.units import human_bytes

_METRIC = {"rss": "host RSS", "cuda_allocated": "CUDA allocated"}


def attached_lines(s: RunSummary) -> list[str]:
    """A run attached by pid: when the process started, when memscope came and went."""
    a = s.attached
    assert a is not None
    since = ""
    if a.process_started is not None:
        since = f", {_span(a.attached - a.process_started)} after it started ({clock(a.process_started)})"
    lines = [f"attached  pid {a.pid} at {clock(a.attached)}{since}; steps count from the attach "
             "(the training's own step number before it is unknown)"]
    if a.detached is not None:
        lines.append(f"detached  {clock(a.detached)} ({shown_text(a.how_it_ended or 'asked')}); the "
                     "training went on")
    elif a.how_it_ended:
        lines.append(f"ended     {shown_text(a.how_it_ended)}")
    return lines


def _span(seconds: float) -> str:
    s = max(0, int(seconds))
    if s >= 86400:
        return f"{s // 86400} d {s % 86400 // 3600} h"
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def render_summary(s: RunSummary) -> str:
    if s.signal is not None:
        ending = f"{s.status}, signal {s.signal}"
    elif s.exit_code is not None:
        ending = f"{s.status}, exit {s.exit_code}"
    else:
        ending = s.status
    duration = f" ({s.ended - s.started:.1f} s)" if s.started and s.ended else ""
    lines = [
        f"run       {shown_text(shlex.join(s.command))}",
        f"status    {shown(ending)}" + (f" · {shown_text(s.cut_short)}" if s.cut_short else ""),
        f"device    {shown(s.device)} · torch {shown(s.torch or '?')} · {len(s.processes)} process(es)",
        f"time      {clock(s.started)} → {_end(s)}{duration}",
    ]
    if s.attached is not None:
        lines.extend(attached_lines(s))
    for t in s.techniques:  # attach --try: the numbers below are of the changed training
        lines.append(f"{'applied' if t['applied'] else 'not applied':<9} {shown_text(t['message'])} (--try)")
    step_line = f"steps     {s.steps} completed"
    if s.step_mode:
        step_line += f" (boundaries: {shown(s.step_mode)})"
    if s.median_step_s is not None:
        step_line += f", median {s.median_step_s * 1000:.0f} ms/step"
    lines.append(step_line)
    lines.append(f"samples   {s.samples}" + (f" ({s.dropped} dropped)" if s.dropped else ""))
    lines.extend(f"recording {shown_text(note)}" for note in s.recording)
    lines.extend(f"measured  {shown_text(note)}" for note in s.measured)
    if s.peak.bytes is None:
        lines.append("peak      -")
    else:
        where = f"at step {s.peak.step}" if s.peak.step is not None else "outside any step"
        if s.oom is not None and s.oom.kind == "oom" and s.peak.step is not None and s.oom.step == s.peak.step:
            where += " (the step that ran out of memory)"
        lines.append(f"peak      {human_bytes(s.peak.bytes)} {_METRIC.get(s.peak.metric, s.peak.metric)} {where}")
        if s.peak.whole_run_bytes and s.peak.whole_run_bytes > s.peak.bytes:
            lines.append(f"          {human_bytes(s.peak.whole_run_bytes)} at most over the whole run, "
                         "outside the steps (start-up, evaluation, shutdown)")
    if s.peak.breakdown:
        bd = s.peak.breakdown
        lines.append("breakdown " + " · ".join(f"{k.replace('_', ' ')} {human_bytes(v)}"
                                               for k, v in bd.items() if v or k != "leaked")
                     + breakdown_source(s.peak))
    if s.oom is not None and s.oom.kind == "oom":
        where = ", ".join(shown(x) for x in (s.oom.phase, s.oom.module) if x)
        at = f"at step {s.oom.step}" if s.oom.step is not None else "outside any step"
        on = f" on rank {s.oom.rank}" if s.oom.rank is not None else ""
        limit = s.oom.limit
        absurd = (s.oom.requested_bytes or 0) > ABSURD_REQUEST  # a shape bug: no limit is to blame
        over = f", over {limit_line(limit, None)}" if limit is not None and not absurd else ""
        lines.append(f"oom       out of memory{on} {at} ({where}), requested "
                     f"{human_bytes(s.oom.requested_bytes)}{over} ({command_hint('oom', s.path)} explains it)")
    if len(s.ranks) > 1:
        lines.extend(render_ranks(s.ranks, _METRIC.get(s.peak.metric, s.peak.metric)))
    if s.hotspots:
        per = micro_batch_note(s.hotspot_micro_batches, s.hotspot_closure_forwards)
        lines.append(f"hotspots  activations saved for backward, profiled step {s.hotspot_step}"
                     + (f", {per}" if per else "") + f" ({command_hint('layers', s.path)} for all modules)")
        lines.append(render_hotspots(s.hotspots[:_TOP], with_details=False, indent="  "))
        if note := compiled_note(s.hotspots, shown):
            lines.append(f"  note: {note}")
    lines.extend(render_leaks(s))
    lines.extend(render_suggestions(suggest_for(s)))
    return "\n".join(lines)


def _end(s: RunSummary) -> str:
    if s.ended:
        return clock(s.ended)
    return "still running" if s.status == "running" else "never recorded"


def render_leaks(s: RunSummary) -> list[str]:
    """The leak lines: each leak, or none, or not enough inventories to tell (with what to do);
    growth no tensor group explains; DataLoader workers copying their dataset."""
    out = []
    for lk in s.leaks[:3]:
        per_step = ("~" if lk.kind == "graph" else "+") + human_bytes(lk.bytes_per_step) + "/step"
        if lk.kind == "graph":  # nodes counted; bytes a node measured on the run, or estimated
            per_step += f" ({lk.node_cost.phrase()})"
        out.append(f"leak      {shown_text(describe(lk))}: {per_step}, held by "
                   f"{shown(lk.held_by or 'unknown')} ({command_hint('leaks', s.path)})")
    if len(s.leaks) > 3:
        out.append(f"          {len(s.leaks) - 3} more ({command_hint('leaks', s.path)})")
    if not s.leaks:
        check = s.leak_check
        if check.verdict == "ok":
            out.append(f"leaks     none in {check.inventories} inventories")
        else:
            out.append(f"leaks     not enough inventories to tell: {check.advice()}")
    note = s.leak_check.coverage()
    if note:
        out.append(f"          note: {shown_text(note)}")
    u = s.unexplained
    if u is not None:
        metric = u.label
        out.append(f"growth    {metric} +{human_bytes(u.bytes_per_step)}/step (steps {u.first_step}–"
                   f"{u.last_step}) that no tensor group explains ({command_hint('leaks', s.path)})")
    w = s.workers
    if w is not None:
        out.append(f"workers   {w.workers} DataLoader worker(s) copied {human_bytes(w.uss_end - w.uss_start)} "
                   f"of their dataset (copy-on-read; {command_hint('leaks', s.path)})")
    return out


def render_suggestions(items: list[Suggestion], top: int = 5, indent: str = "  ") -> list[str]:
    """The "Suggestions" section: technique, estimated saving, the change, and what it rests on."""
    if not items:
        return []
    more = f"; {len(items) - top} more in --json" if len(items) > top else ""
    out = [f"suggestions ranked by estimated saving at the peak{more}"]
    for x in items[:top]:
        out.append(f"{indent}{shown(x.technique)}: saves about {human_bytes(x.estimated_saving_bytes)}")
        out.append(f"{indent}  how   {shown_text(x.how)}")
        out.append(f"{indent}  why   {shown_text(x.evidence)}")
    return out


_TOP = 8


def render_ranks(ranks: list[RankSummary], metric: str) -> list[str]:
    """The per-rank table and the imbalance line of the text report."""
    ratio = imbalance(ranks)
    head = f"ranks     {len(ranks)} processes, peak {metric} per rank"
    hi, lo = heaviest(ranks), lightest(ranks)
    if ratio is not None and hi is not None and lo is not None:
        head += (f"; imbalance {ratio * 100:.1f}% (rank {_rank(hi)} {human_bytes(hi.peak_bytes)}"
                 f" vs rank {_rank(lo)} {human_bytes(lo.peak_bytes)})")
    table = [["rank", "local", "host", "steps", "peak", "at step", "ms/step", "status"]]
    for r in ranks:
        table.append([_rank(r), "-" if r.local_rank is None else str(r.local_rank), shown(r.host or "-"),
                      str(r.steps), human_bytes(r.peak_bytes),
                      "-" if r.peak_step is None else str(r.peak_step),
                      "-" if r.median_step_s is None else f"{r.median_step_s * 1000:.0f}",
                      shown(r.status) + (" OOM" if r.oom else "")])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    out = [head]
    for row in table:
        cells = [c.ljust(w) if i in (2, 7) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.append("  " + "  ".join(cells).rstrip())
    return out


def _rank(r: RankSummary) -> str:
    return f"#{r.proc}" if r.rank is None else str(r.rank)


def render_hotspots(spots: list[Hotspot], with_details: bool = True, indent: str = "") -> str:
    """A table of hotspots: module, type, activation bytes, share (and output bytes, forward and
    backward ms, calls; backward "-" where none was timed)."""
    head = ["module", "type", "activations", "share"]
    if with_details:
        head += ["outputs", "forward ms", "backward ms", "calls"]
    table = [head]
    for h in spots:
        row = [shown(h.module) or "(model)", shown(h.type) or "-", human_bytes(h.activation_bytes),
               f"{h.share * 100:.1f}%"]
        if with_details:
            row += [human_bytes(h.output_bytes), f"{h.forward_s * 1000:.2f}",
                    "-" if h.backward_s is None else f"{h.backward_s * 1000:.2f}", str(h.calls)]
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    out = []
    for r in table:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append(indent + "  ".join(cells).rstrip())
    return "\n".join(out)


def render_headless(s: Headline | RunSummary) -> str:
    peak = human_bytes(s.peak.bytes) if s.peak.bytes is not None else "-"
    step = f" at step {s.peak.step}" if s.peak.step is not None else ""
    line = (f"memscope: {shown_text(s.path)} · {s.steps} steps · peak {peak} "
            f"{_METRIC.get(s.peak.metric, s.peak.metric)}{step} · {shown(s.status)}")
    if s.dropped:
        line += f" · {s.dropped} rows dropped"
    return "\n".join([line, *(f"memscope: recording {shown_text(note)}" for note in s.recording)])

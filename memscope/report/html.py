"""``memscope report RUN.db --html OUT.html``: one self-contained page, readable offline.

The memory timeline is drawn as inline SVG built here (no JavaScript, no fonts, no CDN: the
page makes no request), followed by the peak and its breakdown, the OOM post-mortem, hotspots,
leaks, suggestions and, for distributed runs, one row per rank. Everything shown comes from
memscope.analysis; this module only lays it out.

    with RunReader("run.db") as reader:
        page = render_html(reader)
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Sequence

from memscope import __version__
from memscope.analysis.leaks import describe, fix_how
from memscope.analysis.oom import OomReport, advice
from memscope.analysis.oom_limits import profile_hint
from memscope.analysis.suggestions import suggest
from memscope.analysis.summary import RunSummary, summarize
from memscope.analysis.timeline import Series, memory_timeline
from memscope.report.format import breakdown_source, clock
from memscope.display import shown_text
from memscope.units import human_bytes
from memscope.store.reader import RunReader

# Chart geometry: fixed, so the page lays out the same everywhere (and a test can find it)
CHART_W, CHART_H = 1100, 320
PAD_L, PAD_R, PAD_T, PAD_B = 78, 16, 14, 34
BUCKETS = 600  # points per series: finer than the chart's pixel columns
MAX_STEP_BANDS = 400  # more step spans than this would be a grey smear: not drawn
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
OOM_COLOR = "#d62728"


def esc(v: Any) -> str:
    """Any text on the page: shown through memscope.display (no controls, no bidi overrides,
    bounded), then HTML-escaped."""
    return html.escape("-" if v is None else shown_text(v), quote=True)


# -- the chart -------------------------------------------------------------------------------


@dataclass
class Line:
    label: str
    points: list[tuple[float, int]]  # (seconds since run start, bytes)
    color: str
    dashed: bool = False


def chart_lines(reader: RunReader, summary: RunSummary) -> list[Line]:
    """One process: each of its series. Several: each process's primary series, by rank."""
    procs = summary.processes
    lines: list[Line] = []
    if len(procs) <= 1:
        tl = memory_timeline(reader, BUCKETS, marks=False)
        for i, s in enumerate(tl.series.values()):
            lines.append(Line(s.label, s.points, PALETTE[i % len(PALETTE)], dashed=i > 0))
        return lines
    for i, p in enumerate(procs):
        tl = memory_timeline(reader, BUCKETS, proc=int(p["id"]), marks=False)
        primary: Series | None = tl.primary
        if primary is None or not primary.points:
            continue
        who = f"rank {p['rank']}" if p["rank"] is not None else f"pid {p['pid']}"
        lines.append(Line(f"{who} {primary.label}", primary.points, PALETTE[i % len(PALETTE)]))
    return lines


def _nice_step(span: float, ticks: int) -> float:
    raw = span / max(ticks, 1)
    if raw <= 0:
        return 1.0
    mag = 10 ** _floor_log10(raw)
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return float(m * mag)
    return float(10 * mag)


def _floor_log10(x: float) -> int:
    n = 0
    while x >= 10:
        x /= 10
        n += 1
    while x < 1:
        x *= 10
        n -= 1
    return n


def render_chart(lines: Sequence[Line], steps: Sequence[tuple[float, float]],
                 oom_t: float | None, peak_span: tuple[float, float] | None) -> str:
    """The timeline as an SVG element: x = seconds since the run started, y = bytes."""
    pts = [pt for ln in lines for pt in ln.points]
    if not pts:
        return (f'<svg id="timeline" width="{CHART_W}" height="{CHART_H}" role="img">'
                f'<text x="{CHART_W // 2}" y="{CHART_H // 2}" text-anchor="middle" fill="#666">'
                "no memory samples in this run</text></svg>")
    t_lo = min(t for t, _ in pts)
    t_hi = max([t for t, _ in pts] + ([oom_t] if oom_t is not None else []))
    if t_hi <= t_lo:
        t_hi = t_lo + 1.0
    v_hi = max(v for _, v in pts)
    # y from 0: memory is read against zero, and a flat line should look flat
    unit = 1024 ** max(0, min(4, _floor_log10(v_hi) // 3)) if v_hi > 0 else 1  # KiB, MiB..: round labels
    while unit > 1 and v_hi / unit < 1:
        unit //= 1024
    y_step = _nice_step(v_hi / unit, 4) * unit if v_hi > 0 else 1.0
    y_top = y_step * (int(v_hi / y_step) + 1)
    plot_w, plot_h = CHART_W - PAD_L - PAD_R, CHART_H - PAD_T - PAD_B

    def x(t: float) -> float:
        return PAD_L + (t - t_lo) / (t_hi - t_lo) * plot_w

    def y(v: float) -> float:
        return PAD_T + plot_h - v / y_top * plot_h

    out = [f'<svg id="timeline" width="{CHART_W}" height="{CHART_H}" role="img" '
           f'viewBox="0 0 {CHART_W} {CHART_H}" font-family="sans-serif" font-size="11">',
           f'<rect x="{PAD_L}" y="{PAD_T}" width="{plot_w}" height="{plot_h}" fill="#fafafa" '
           'stroke="#ccc"/>']
    if len(steps) <= MAX_STEP_BANDS:  # alternate bands: where each step began and ended
        for i, (a, b) in enumerate(steps):
            if i % 2 == 0 and b >= t_lo and a <= t_hi:
                xa, xb = x(max(a, t_lo)), x(min(b, t_hi))
                out.append(f'<rect class="step" x="{xa:.1f}" y="{PAD_T}" width="{max(xb - xa, 0.5):.1f}" '
                           f'height="{plot_h}" fill="#eef1f6"/>')
    v = 0.0
    while v <= y_top + 1e-9:
        yy = y(v)
        out.append(f'<line x1="{PAD_L}" x2="{CHART_W - PAD_R}" y1="{yy:.1f}" y2="{yy:.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{PAD_L - 6}" y="{yy + 4:.1f}" text-anchor="end" fill="#444">'
                   f'{esc(human_bytes(v))}</text>')
        v += y_step
    t_step = _nice_step(t_hi - t_lo, 8)
    t = t_step * int(t_lo / t_step)
    while t <= t_hi + 1e-9:
        if t >= t_lo:
            out.append(f'<text x="{x(t):.1f}" y="{CHART_H - PAD_B + 16}" text-anchor="middle" '
                       f'fill="#444">{t:g} s</text>')
        t += t_step
    if peak_span is not None:
        xa, xb = x(peak_span[0]), x(peak_span[1])
        out.append(f'<rect class="peak" x="{xa:.1f}" y="{PAD_T}" width="{max(xb - xa, 1.5):.1f}" '
                   f'height="{plot_h}" fill="#ffdd57" fill-opacity="0.45"><title>peak step</title></rect>')
    for ln in lines:
        coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in ln.points)
        dash = ' stroke-dasharray="6 3"' if ln.dashed else ""
        out.append(f'<polyline class="series" fill="none" stroke="{ln.color}" stroke-width="2"'
                   f'{dash} points="{coords}"><title>{esc(ln.label)}</title></polyline>')
    if oom_t is not None:
        xo = x(oom_t)
        out.append(f'<line class="oom" x1="{xo:.1f}" x2="{xo:.1f}" y1="{PAD_T}" y2="{PAD_T + plot_h}" '
                   f'stroke="{OOM_COLOR}" stroke-width="2"/>')
        out.append(f'<text x="{xo - 4:.1f}" y="{PAD_T + 12}" text-anchor="end" fill="{OOM_COLOR}" '
                   'font-weight="bold">OOM</text>')
    out.append("</svg>")
    return "".join(out)


def legend(lines: Sequence[Line], has_peak: bool, has_oom: bool) -> str:
    items = [f'<span class="key"><i style="background:{ln.color}"></i>{esc(ln.label)}</span>'
             for ln in lines]
    if has_peak:
        items.append('<span class="key"><i style="background:#ffdd57"></i>peak step</span>')
    if has_oom:
        items.append(f'<span class="key"><i style="background:{OOM_COLOR}"></i>out of memory</span>')
    items.append('<span class="key"><i style="background:#eef1f6"></i>steps (alternate bands)</span>')
    return '<div class="legend">' + " ".join(items) + "</div>"


# -- sections --------------------------------------------------------------------------------


def _table(head: Sequence[str], rows: Sequence[Sequence[str]],
           numeric: frozenset[int] | set[int] = frozenset()) -> str:
    """Cells are already escaped HTML; ``numeric`` column indexes are right-aligned."""
    th = "".join(f'<th{" class=num" if i in numeric else ""}>{h}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{c}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _facts(s: RunSummary) -> str:
    ending = s.status + (f", signal {s.signal}" if s.signal is not None else
                         f", exit {s.exit_code}" if s.exit_code is not None else "")
    duration = f" ({s.ended - s.started:.1f} s)" if s.started and s.ended else ""
    median = f", median {s.median_step_s * 1000:.0f} ms/step" if s.median_step_s else ""
    metric = "CUDA allocated" if s.peak.metric == "cuda_allocated" else "host RSS"
    peak = "-" if s.peak.bytes is None else (
        f"{human_bytes(s.peak.bytes)} {metric}" + (f" at step {s.peak.step}" if s.peak.step is not None else ""))
    rows = [("run", " ".join(s.command)), ("status", ending),
            ("device", f"{s.device} · torch {s.torch or '-'} · {len(s.processes)} process(es)"),
            ("time", f"{clock(s.started)} → {clock(s.ended)}{duration}"),
            ("steps", f"{s.steps} completed (boundaries: {s.step_mode or '-'}){median}"),
            ("samples", f"{s.samples}" + (f" ({s.dropped} dropped)" if s.dropped else "")),
            ("peak", peak)]
    if s.peak.whole_run_bytes and s.peak.bytes and s.peak.whole_run_bytes > s.peak.bytes:
        rows.append(("", f"{human_bytes(s.peak.whole_run_bytes)} at most over the whole run, "
                         "outside the steps"))
    return '<table class="facts">' + "".join(
        f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows) + "</table>"


def _breakdown(s: RunSummary) -> str:
    bd = {k: v for k, v in (s.peak.breakdown or {}).items() if v or k != "leaked"}  # leaked: when any
    if not bd:
        return ""
    total = sum(v for v in bd.values() if v) or 1
    colors = dict(zip(bd, PALETTE))
    bar = "".join(f'<span style="width:{100 * (v or 0) / total:.2f}%;background:{colors[k]}" '
                  f'title="{esc(k)}"></span>' for k, v in bd.items())
    keys = " ".join(f'<span class="key"><i style="background:{colors[k]}"></i>{esc(k.replace("_", " "))} '
                    f"{esc(human_bytes(v))}</span>" for k, v in bd.items())
    return (f'<h2>At the peak <small>{esc(breakdown_source(s.peak).strip())}</small></h2>'
            f'<div class="bar">{bar}</div><div class="legend">{keys}</div>')


def _oom(r: OomReport | None) -> str:
    if r is None:
        return ""
    where = ", ".join(str(x) for x in (f"step {r.step}" if r.step is not None else None,
                                       r.phase, r.module) if x)
    who = f"rank {r.rank}: " if r.rank is not None else ""
    title = "Out of memory" if r.kind == "oom" else "Killed"
    facts = [("where", who + (where or "-")), ("message", r.message)]
    if r.requested_bytes is not None:
        facts.append(("requested", human_bytes(r.requested_bytes)))
    if r.live_bytes is not None:
        facts.append(("live", human_bytes(r.live_bytes)))
    bd = r.breakdown
    if bd:  # what was live at the failure, or at the last profiled step before it (said which)
        when = (f"at the failure (step {r.step})" if r.breakdown_at_failure
                else f"at profiled step {r.breakdown_step}")
        facts.append((f"live {when}", " · ".join(f"{k.replace('_', ' ')} {human_bytes(v)}"
                                                 for k, v in bd.items())))
    if r.others:
        facts.append(("", f"{r.others} more out-of-memory error(s) after this one"))
    fixes = "".join(f"<li>{esc(a)}</li>" for a in advice(r))
    return (f'<section class="oom"><h2>{title}</h2><table class="facts">'
            + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
            + f"</table><p>What to change:</p><ul>{fixes}</ul></section>")


def _hotspots(s: RunSummary) -> str:
    if not s.hotspots:
        hint = profile_hint(s.steps, s.oom.step if s.oom is not None else None)
        return f'<h2>Hotspots</h2><p class="none">no per-layer profile in this run ({esc(hint)})</p>'
    rows = [[esc(h.module or "(model)"), esc(h.type),
             esc(human_bytes(h.activation_bytes)),
             f'<span class="share"><span style="width:{100 * h.share:.1f}%"></span></span> '
             f"{100 * h.share:.1f}%"] for h in s.hotspots[:15]]
    return (f"<h2>Hotspots <small>activations saved for backward, profiled step "
            f"{esc(s.hotspot_step)}</small></h2>"
            + _table(["module", "type", "activations", "share"], rows, {2}))


def _leaks(s: RunSummary) -> str:
    """Leaks (with their fix), or none, or not enough inventories to tell; growth no tensor
    group explains; DataLoader workers copying their dataset."""
    parts = ["<h2>Leaks</h2>"]
    if s.leaks:
        rows = [[esc(describe(lk)), esc(("~" if lk.kind == "graph" else "") + human_bytes(lk.bytes_per_step)
                     + (f" ({lk.node_cost.phrase()})" if lk.kind == "graph" else "")),
                 esc(f"{lk.tensors_per_step:g}"), esc(f"{lk.first_step}–{lk.last_step}"),
                 esc(lk.held_by), esc(lk.site), esc(_leak_module(lk.module)), esc(fix_how(lk))]
                for lk in s.leaks]
        parts.append(_table(["group", "per step", "tensors/step", "steps", "held by", "site", "module",
                             "fix"], rows, {1, 2}))
    elif s.leak_check.verdict == "ok":
        parts.append(f'<p class="none">none found in {s.leak_check.inventories} inventories</p>')
    else:
        parts.append(f'<p class="insufficient">not enough inventories to tell: {esc(s.leak_check.advice())}</p>')
    u = s.unexplained
    if u is not None:
        metric = u.label
        parts.append(f'<p class="growth">{esc(metric)} grows by {esc(human_bytes(u.bytes_per_step))}/step '
                     f"from step {u.first_step} to {u.last_step}, and no tensor group explains it "
                     f"(inventories: {esc(u.explained_words())}). "
                     f"{esc(u.how())}</p>")
    w = s.workers
    if w is not None:
        parts.append(f'<p class="growth">{w.workers} of {w.of_workers} DataLoader worker(s) copied '
                     f"{esc(human_bytes(w.uss_end - w.uss_start))} of their dataset into private memory "
                     f"(USS {esc(human_bytes(w.uss_start))} → {esc(human_bytes(w.uss_end))} in "
                     f"{w.seconds:.0f} s). {esc(w.how())}</p>")
    return "".join(parts)


def _leak_module(module: str | None) -> str | None:
    """The module whose forward made the leaked tensors: the root as "(model)"; None: unknown
    (made outside any module's forward, or no site was recorded)."""
    return "(model)" if module == "" else module


def suggestions_of(reader: RunReader, s: RunSummary) -> list[dict[str, Any]]:
    """The ranked suggestions, as ``memscope report --json`` lists them."""
    return [sg.as_json() for sg in suggest(reader, s)]


def _suggestions(items: list[dict[str, Any]]) -> str:
    if not items:
        return '<h2>Suggestions</h2><p class="none">nothing to suggest</p>'
    rows = [[f"<b>{esc(i['technique'])}</b>", esc(human_bytes(i["estimated_saving_bytes"])),
             esc(i["evidence"]), esc(i["how"])] for i in items]
    return "<h2>Suggestions</h2>" + _table(["technique", "saves about", "evidence", "how"], rows, {1})


def _ranks(s: RunSummary) -> str:
    ranks = s.ranks
    if len(ranks) < 2:
        return ""
    rows = [[esc(r.rank), esc(r.host), esc(r.steps), esc(human_bytes(r.peak_bytes)),
             esc(r.peak_step),
             esc(f"{r.median_step_s * 1000:.0f}" if r.median_step_s else None),
             esc(r.status + (" OOM" if r.oom else ""))] for r in ranks]
    return "<h2>Ranks</h2>" + _table(["rank", "host", "steps", "peak", "at step", "ms/step",
                                      "status"], rows, {2, 3, 5})


# -- the page --------------------------------------------------------------------------------

CSS = """
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;background:#fff}
header{height:64px;box-sizing:border-box;padding:10px 16px;background:#263238;color:#fff;overflow:hidden}
header h1{margin:0;font-size:18px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
header p{margin:2px 0 0;font-size:13px;color:#cfd8dc}
#chart{padding:0 16px;height:320px}
main{padding:4px 16px 24px;max-width:1100px}
h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid #eee}
h2 small{font-weight:normal;color:#666}
table{border-collapse:collapse}
th,td{text-align:left;padding:2px 10px 2px 0;vertical-align:top}
td.num,th.num{text-align:right;white-space:nowrap}
thead th{border-bottom:1px solid #ccc}
.facts th{color:#555;font-weight:normal;padding-right:16px}
.legend{margin:4px 0;color:#333;font-size:12px}
.key{margin-right:14px;white-space:nowrap}
.key i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.bar{display:flex;height:18px;width:100%;border:1px solid #ccc}
.bar span{display:block;height:100%}
.share{display:inline-block;width:80px;height:8px;background:#eee;vertical-align:middle}
.share span{display:block;height:100%;background:#1f77b4}
.oom{border-left:4px solid #d62728;padding-left:12px}
.none{color:#666}
.insufficient,.growth{color:#a15c00}
footer{color:#888;font-size:12px;padding:0 16px 16px}
"""


def step_spans(reader: RunReader, proc: int | None, origin: float) -> list[tuple[float, float]]:
    """(start, end) of each step of ``proc`` since ``origin``; none past MAX_STEP_BANDS steps (the
    chart draws no bands then): a long run's steps stay in the file."""
    if proc is None:
        return []
    rows = reader.query("SELECT start, end FROM steps WHERE proc = ? ORDER BY step LIMIT ?",
                        (proc, MAX_STEP_BANDS + 1))
    if len(rows) > MAX_STEP_BANDS:
        return []
    return [(st["start"] - origin, st["end"] - origin) for st in rows]


def render_html(reader: RunReader, summary: RunSummary | None = None) -> str:
    s = summary if summary is not None else summarize(reader)
    lines = chart_lines(reader, s)
    origin = (reader.run() or {}).get("started") or 0.0
    spans = step_spans(reader, s.main_proc, origin)
    peak_span = None
    if s.peak.step is not None:
        for st in reader.query("SELECT start, end FROM steps WHERE proc = ? AND step = ?",
                               (s.peak.proc if s.peak.proc is not None else s.main_proc, s.peak.step)):
            peak_span = (st["start"] - origin, st["end"] - origin)
    oom_t = None
    if s.oom is not None and s.oom.kind == "oom":
        first = reader.events("oom")
        oom_t = first[0]["t"] - origin if first else None
    title = " ".join(s.command) or s.path
    names = [e["message"] for e in reader.events("run_name") if e["message"]]
    if names:  # named by a framework callback (memscope.integrations)
        title = f"{names[0]} · {title}"
    chart = render_chart(lines, spans, oom_t, peak_span)
    return "".join([
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>memscope · {esc(title)}</title><style>{CSS}</style></head><body>",
        f"<header><h1>memscope report · {esc(title)}</h1>",
        f"<p>{esc(s.status)} · {esc(s.steps)} steps · peak {esc(human_bytes(s.peak.bytes))}"
        f" · {esc(s.device)}</p></header>",
        f'<div id="chart">{chart}</div>',
        "<main>",
        legend(lines, peak_span is not None, oom_t is not None),
        _oom(s.oom),
        "<h2>Run</h2>", _facts(s), _breakdown(s),
        _hotspots(s), _leaks(s), _suggestions(suggestions_of(reader, s)), _ranks(s),
        "</main>",
        f"<footer>memscope {esc(__version__)} · {esc(s.path)}</footer></body></html>\n",
    ])

"""``memscope report RUN.db --html OUT.html``: one self-contained page, readable offline.

The charts (memscope.report.html_charts) are inline SVG as wide as the window, with a few lines
of inline script for their tooltips (no fonts, no CDN: the page makes no request): memory over
time, memory by category over the steps, each leak's growth, the hotspots as bars; then the
peak and its breakdown, the OOM post-mortem, leaks, suggestions and, for distributed runs, one
row per rank. Everything shown comes from memscope.analysis; this module only lays it out.

    with RunReader("run.db") as reader:
        page = render_html(reader)
"""

from __future__ import annotations

from typing import Any, Sequence

from memscope import __version__
from memscope.analysis.leaks import Leak, describe, fix_how
from memscope.analysis.oom import OomReport, advice
from memscope.analysis.oom_limits import profile_hint
from memscope.analysis.suggestions import suggest
from memscope.analysis.summary import RunSummary, summarize
from memscope.analysis.categories import CategoryTimeline, LeakGrowth
from memscope.analysis.run_timeline import RunTimeline, run_timeline
from memscope.analysis.timeline import Series, memory_timeline
from memscope.report.format import breakdown_source, clock, command_hint
from memscope.report.html_charts import (LEAK_COLORS, PALETTE, Line, category_chart, esc, leak_chart, part_color,
                                         timeline_chart)
from memscope.units import human_bytes
from memscope.store.reader import RunReader

BUCKETS = 600  # points per series: finer than the chart's pixel columns


# -- the chart lines ---------------------------------------------------------------------------


def chart_lines(reader: RunReader, summary: RunSummary, timeline: RunTimeline) -> list[Line]:
    """One process: each of its series. Several: each process's primary series, by rank."""
    procs = summary.processes
    lines: list[Line] = []
    if len(procs) <= 1:
        for i, s in enumerate(timeline.memory.series.values()):
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


def legend(items: Sequence[tuple[str, str]]) -> str:
    return '<div class="legend">' + " ".join(
        f'<span class="key"><i style="background:{color}"></i>{esc(label)}</span>' for label, color in items) + "</div>"


# -- sections --------------------------------------------------------------------------------


def _table(head: Sequence[str], rows: Sequence[Sequence[str]],
           numeric: frozenset[int] | set[int] = frozenset()) -> str:
    """Cells are already escaped HTML; ``numeric`` column indexes are right-aligned."""
    th = "".join(f'<th{" class=num" if i in numeric else ""}>{h}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{c}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<div class="wide"><table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


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
    # the categories in the category chart's colours; one a newer report adds (leaked) in grey
    bar = "".join(f'<span style="width:{100 * (v or 0) / total:.2f}%;background:{part_color(k)}" '
                  f'title="{esc(k)}"></span>' for k, v in bd.items())
    keys = " ".join(f'<span class="key"><i style="background:{part_color(k)}"></i>{esc(k.replace("_", " "))} '
                    f"{esc(human_bytes(v))}</span>" for k, v in bd.items())
    return (f'<h2>At the peak <small>{esc(breakdown_source(s.peak).strip())}</small></h2>'
            f'<div class="bar">{bar}</div><div class="legend">{keys}</div>')


def _oom(r: OomReport | None, path: str) -> str:
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
            + f"</table><p>What to change:</p><ul>{fixes}</ul>"
            + f'<p class="hint">in a terminal: <code>{esc(command_hint("oom", path))}</code></p></section>')


def _hotspots(s: RunSummary) -> str:
    """The modules that saved the most for backward, as horizontal bars (their share of the step's
    saved bytes)."""
    if not s.hotspots:
        hint = profile_hint(s.steps, s.oom.step if s.oom is not None else None, running=s.status == "running")
        return f'<h2>Hotspots</h2><p class="none">no per-layer profile in this run ({esc(hint)})</p>'
    rows = "".join(
        f'<div class="hbar"><span class="name">{esc(h.module or "(model)")} <small>{esc(h.type)}</small></span>'
        f'<span class="track"><span style="width:{100 * h.share:.1f}%"></span></span>'
        f'<span class="num">{esc(human_bytes(h.activation_bytes))} · {100 * h.share:.1f}%</span></div>'
        for h in s.hotspots[:15])
    more = (f' <small>{len(s.hotspots) - 15} more: <code>{esc(command_hint("layers", s.path))}</code></small>'
            if len(s.hotspots) > 15 else "")
    return (f'<h2>Hotspots <small>activations saved for backward, profiled step '
            f"{esc(s.hotspot_step)}</small></h2>"
            f'<div class="hbars" id="layers">{rows}</div>'
            f'<p class="hint">every module, with output bytes and times: '
            f'<code>{esc(command_hint("layers", s.path))}</code>{more}</p>')


def _leaks(s: RunSummary, growth: Sequence[LeakGrowth]) -> str:
    """Leaks (with their fix and their growth against the steps), or none, or not enough
    inventories to tell; growth no tensor group explains; DataLoader workers copying their
    dataset."""
    parts = ["<h2>Leaks</h2>"]
    for i, g in enumerate(growth):
        parts.append(f'<h3>leak {i + 1}: {esc(g.label)} <small>+{esc(human_bytes(g.leak.bytes_per_step))}/step, '
                     f"steps {g.leak.first_step}–{g.leak.last_step}</small></h3>")
        parts.append(leak_chart(g, i))
        parts.append(legend([(f"leak {i + 1} at each inventory", LEAK_COLORS[i % len(LEAK_COLORS)]),
                             ("the verdict's rate", "#333")]))
        if i < len(s.leaks):
            parts.append(_leak_facts(s.leaks[i], i))
    for i, lk in enumerate(s.leaks[len(growth):], len(growth)):  # none read for it: its facts all the same
        parts.append(f"<h3>leak {i + 1}: {esc(describe(lk))}</h3>" + _leak_facts(lk, i))
    if not s.leaks and s.leak_check.verdict == "ok":
        parts.append(f'<p class="none">none found in {s.leak_check.inventories} inventories</p>')
    elif not s.leaks:
        parts.append(f'<p class="insufficient">not enough inventories to tell: {esc(s.leak_check.advice())}</p>')
    u = s.unexplained
    if u is not None:
        metric = u.label
        parts.append(f'<p class="growth">{esc(metric)} grows by {esc(human_bytes(u.bytes_per_step))}/step '
                     f"from step {u.first_step} to {u.last_step}, and no tensor group explains it "
                     f"(inventories: {esc(u.explained_words())}). "
                     f"{esc(u.how())}</p>")
    if s.leaks or u is not None:
        parts.append(f'<p class="hint">every group that changed between two inventories: '
                     f'<code>{esc(command_hint("leaks", s.path))}</code></p>')
    w = s.workers
    if w is not None:
        parts.append(f'<p class="growth">{w.workers} of {w.of_workers} DataLoader worker(s) copied '
                     f"{esc(human_bytes(w.uss_end - w.uss_start))} of their dataset into private memory "
                     f"(USS {esc(human_bytes(w.uss_start))} → {esc(human_bytes(w.uss_end))} in "
                     f"{w.seconds:.0f} s). {esc(w.how())}</p>")
    return "".join(parts)


def _leak_facts(lk: Leak, i: int) -> str:
    """One leak's facts, a row each (readable at any width), its fix last."""
    per_step = (("~" if lk.kind == "graph" else "+") + human_bytes(lk.bytes_per_step) + "/step"
                + (f" ({lk.node_cost.phrase()})" if lk.kind == "graph" else ""))
    facts = [("per step", per_step), ("tensors/step", f"{lk.tensors_per_step:g}"),
             ("steps", f"{lk.first_step}–{lk.last_step}"), ("held by", lk.held_by), ("site", lk.site),
             ("module", _leak_module(lk.module)), ("created at", lk.created_at), ("fix", fix_how(lk))]
    return (f'<table class="facts leak" id="leak-{i + 1}-facts">'
            + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts) + "</table>")


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

def _categories(cats: CategoryTimeline) -> str:
    """Memory by category over the steps: stacked bars, the leaking groups on top."""
    if not cats.points:
        return ""
    chart, keys = category_chart(cats)
    moment = ("tensors at the end of each inventoried step" if cats.at == "end"
              else "at the peak of each profiled step")
    other = ("" if "other" in cats.stack else
             f"; not stacked: other, the {esc(cats.metric_label)} no tensor explains (the interpreter, "
             "its libraries, allocator caches), in each bar's tip")
    return (f"<h2>Memory by category <small>{moment}{other}</small></h2>" + chart + legend(keys))


CSS = """
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;background:#fff}
header{padding:10px 16px;background:#263238;color:#fff;overflow:hidden}
header h1{margin:0;font-size:18px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
header p{margin:2px 0 0;font-size:13px;color:#cfd8dc}
main{padding:4px 16px 24px;max-width:1400px}
h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid #eee}
h3{font-size:14px;margin:12px 0 4px;overflow-wrap:anywhere}
h2 small,h3 small{font-weight:normal;color:#666}
table{border-collapse:collapse;max-width:100%}
th,td{text-align:left;padding:2px 10px 2px 0;vertical-align:top;overflow-wrap:break-word}
.wide{overflow-x:auto;max-width:100%}
.facts td{overflow-wrap:anywhere}
td.num,th.num{text-align:right;white-space:nowrap}
thead th{border-bottom:1px solid #ccc}
.facts th{color:#555;font-weight:normal;padding-right:16px;white-space:nowrap}
.legend{margin:4px 0;color:#333;font-size:12px;overflow-wrap:anywhere}
.key{margin-right:14px;display:inline-block}
.key i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.bar{display:flex;height:18px;width:100%;border:1px solid #ccc}
.bar span{display:block;height:100%}
.chart{display:grid;grid-template-columns:64px minmax(0,1fr);margin:8px 0 0;font-size:11px;color:#444}
.ylab{position:relative}
.ylab span{position:absolute;right:6px;transform:translateY(-50%);white-space:nowrap}
.plotbox{position:relative;min-width:0;padding-bottom:18px}
svg.plot{display:block;width:100%;overflow:visible}
svg.plot .frame{fill:#fafafa;stroke:#ccc;vector-effect:non-scaling-stroke}
svg.plot .grid{stroke:#ddd;vector-effect:non-scaling-stroke}
svg.plot .step{fill:#eef1f6}
svg.plot .peak{fill:#ffdd57;fill-opacity:.45}
svg.plot polyline,svg.plot line{fill:none;vector-effect:non-scaling-stroke}
svg.plot .series{stroke-width:2}
svg.plot .fit{stroke-width:1.5}
svg.plot .hit{fill:transparent}
svg.plot .hit:hover{fill:rgba(0,0,0,.07)}
.xlab{position:absolute;left:0;right:0;bottom:0;height:16px}
.xlab span{position:absolute;transform:translateX(-50%);white-space:nowrap}
.xlab span:first-child{transform:none}
.flag{position:absolute;top:2px;margin-left:3px;font-weight:bold;font-size:11px}
.flag.end{transform:translateX(-100%);margin-left:-3px}
.hbars{max-width:900px}
.hbar{display:grid;grid-template-columns:minmax(0,2fr) minmax(60px,3fr) auto;gap:8px;align-items:center}
.hbar .name{overflow-wrap:anywhere}
.hbar .track{height:10px;background:#eee}
.hbar .track span{display:block;height:100%;background:#1f77b4}
.hbar .num{white-space:nowrap;font-variant-numeric:tabular-nums}
.oom{border-left:4px solid #d62728;padding-left:12px}
.none{color:#666}
.hint{color:#555;font-size:13px;overflow-wrap:anywhere}
code{font-size:12px;background:#f3f3f3;padding:0 3px}
.insufficient,.growth{color:#a15c00}
.tip{position:fixed;z-index:9;max-width:min(360px,90vw);padding:6px 8px;background:#263238;color:#fff;
font-size:12px;white-space:pre-line;pointer-events:none;border-radius:3px}
footer{color:#888;font-size:12px;padding:0 16px 16px;overflow-wrap:anywhere}
@media (max-width:700px){th,td{padding-right:6px}.chart{grid-template-columns:52px minmax(0,1fr)}}
"""

# The tooltips: a column's data-tip, as text (textContent: never markup), kept inside the window.
# The tip is the script's sibling, so a notebook with several runs drawn has one each.
SCRIPT = """
(function(){var root=document.currentScript.parentNode,tip=root.querySelector(".tip");
function hide(){tip.hidden=true}
root.querySelectorAll("svg.plot").forEach(function(svg){
svg.addEventListener("mousemove",function(e){var t=e.target.getAttribute("data-tip");
if(!t){hide();return}tip.textContent=t;tip.hidden=false;
var x=e.clientX+14,y=e.clientY+14,w=tip.offsetWidth,h=tip.offsetHeight;
if(x+w>document.documentElement.clientWidth-4)x=Math.max(4,e.clientX-14-w);
if(y+h>window.innerHeight-4)y=Math.max(4,e.clientY-14-h);
tip.style.left=x+"px";tip.style.top=y+"px"});
svg.addEventListener("mouseleave",hide)})})();
"""
TIP = '<div class="tip" hidden></div>'


def scoped(css: str, root: str) -> str:
    """``css`` with every rule's selectors under ``root`` (a notebook output must not restyle
    the notebook); ``body`` becomes ``root`` itself."""
    out = []
    for rule in css.split("}"):
        if "{" not in rule:
            continue
        head, body = rule.split("{", 1)
        head = head.strip()
        if head.startswith("@media"):
            inner = scoped(body + "}", root)
            out.append(f"{head}{{{inner}}}")
            continue
        sels = [root if sel.strip() == "body" else f"{root} {sel.strip()}" for sel in head.split(",")]
        out.append(",".join(sels) + "{" + body + "}")
    return "\n".join(out)


def render_fragment(reader: RunReader, summary: RunSummary | None = None) -> str:
    """The run for a notebook cell (``memscope.load(path)`` shown): the facts, memory over time,
    by category, each leak's growth; styles scoped to it, the same tooltips."""
    s = summary if summary is not None else summarize(reader)
    tl = run_timeline(reader, s, BUCKETS)
    lines = chart_lines(reader, s, tl)
    chart, keys = timeline_chart(lines, tl.memory.steps if len(s.processes) <= 1 else [], tl.marks,
                                 tl.categories if len(s.processes) <= 1 else None)
    root = ".memscope-run"
    return "".join([
        f'<div class="memscope-run"><style>{scoped(CSS, root)}</style>',
        f"<h2>memscope · {esc(_title(reader, s))} <small>{esc(s.path)}</small></h2>",
        _facts(s), "<h2>Memory over time</h2>", chart, legend(keys), _categories(tl.categories),
        _breakdown(s), _leaks(s, tl.leaks),
        f'<p class="hint">the whole report: <code>{esc(command_hint("report", s.path))} --html OUT.html</code></p>',
        f"{TIP}<script>{SCRIPT}</script></div>",
    ])


def _title(reader: RunReader, s: RunSummary) -> str:
    title = " ".join(s.command) or s.path
    names = [e["message"] for e in reader.events("run_name") if e["message"]]
    if names:  # named by memscope.profile(name=...) or a framework callback (memscope.integrations)
        title = f"{names[0]} · {title}"
    return title


def render_html(reader: RunReader, summary: RunSummary | None = None) -> str:
    s = summary if summary is not None else summarize(reader)
    tl = run_timeline(reader, s, BUCKETS)
    lines = chart_lines(reader, s, tl)
    steps = tl.memory.steps if len(s.processes) <= 1 else []
    chart, keys = timeline_chart(lines, steps, tl.marks, tl.categories if len(s.processes) <= 1 else None)
    title = _title(reader, s)
    return "".join([
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>memscope · {esc(title)}</title><style>{CSS}</style></head><body>",
        f"<header><h1>memscope report · {esc(title)}</h1>",
        f"<p>{esc(s.status)} · {esc(s.steps)} steps · peak {esc(human_bytes(s.peak.bytes))}"
        f" · {esc(s.device)}</p></header>",
        "<main>",
        "<h2>Memory over time <small>each bucket's highest sample; hover for the values</small></h2>",
        chart, legend(keys),
        _oom(s.oom, s.path),
        _categories(tl.categories),
        "<h2>Run</h2>", _facts(s), _breakdown(s),
        _hotspots(s), _leaks(s, tl.leaks), _suggestions(suggestions_of(reader, s)), _ranks(s),
        "</main>",
        f"<footer>memscope {esc(__version__)} · {esc(s.path)}</footer>",
        f"{TIP}<script>{SCRIPT}</script></body></html>\n",
    ])

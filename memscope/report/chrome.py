"""A run file as a Chrome trace (Trace Event Format), for Perfetto or chrome://tracing.

One trace process per recorded process (its ``processes.id`` is the pid, named after its rank):
counter tracks (``ph: "C"``) for host RSS and, per CUDA device, allocated/reserved bytes and the
NVML reading; the steps as complete spans (``ph: "X"``) on a ``steps`` thread; OOMs, kills and
the agent's other events as instant events (``ph: "i"``). Times are microseconds since the run
started. Events are streamed to the file, so a run with a million samples is never held in memory.

The two long series (host samples and steps: a million rows each in a long run) have their
times computed in SQL (the same double operations) and are formatted a few thousand at a time;
every column those queries read is checked first (memscope/store/column_guard.py: a damaged
value is one line), and a chunk SQLite cannot read is read again through RunReader's rows.

    with RunReader("run.db") as reader, open("trace.json", "w") as f:
        n = write_chrome_trace(reader, f)
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator, TextIO

from memscope import __version__
from memscope.report.format import iso
from memscope.report.sql_text import Unchecked, after_key, joined_chunks, write_chunk
from memscope.store.reader import RunReader

STEPS_TID = 1  # the thread that carries the step spans and the instant events
COUNTERS_TID = 0
EVENT_SEP = ",\n"
BATCH = 8192  # rows formatted, joined and written at a time
PEAKS = ("peak_rss", "peak_allocated", "peak_reserved")
Block = tuple[str | bytes, int]  # events as JSON text (UTF-8 bytes) joined by EVENT_SEP, and how many


def process_label(proc: dict[str, Any]) -> str:
    """``rank 1 · pid 4242 · host`` (no rank outside torchrun)."""
    parts = [] if proc["rank"] is None else [f"rank {proc['rank']}"]
    parts.append(f"pid {proc['pid']}")
    if proc.get("host"):
        parts.append(str(proc["host"]))
    return " · ".join(parts)


def chrome_events(reader: RunReader) -> Iterator[dict[str, Any] | Block]:
    """Every trace event of the run: metadata first, then per process counters, spans, instants.
    An event is a dict, or a :data:`Block` of events as JSON text already (samples and steps)."""
    statuses: dict[str, str] = {}
    run = reader.run()
    procs = reader.processes()
    origin = _origin(reader, run)

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    for p in procs:
        pid = int(p["id"])
        yield {"ph": "M", "name": "process_name", "pid": pid, "tid": COUNTERS_TID,
               "args": {"name": process_label(p)}}
        # Perfetto orders processes by this index: ranks in order, unranked processes after them
        sort = p["rank"] if p["rank"] is not None else 100000 + pid
        yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": COUNTERS_TID,
               "args": {"sort_index": sort}}
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": STEPS_TID,
               "args": {"name": "steps"}}
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": COUNTERS_TID,
               "args": {"name": "memory"}}

    for p in procs:
        pid = int(p["id"])
        yield from _sample_blocks(reader, pid, origin, us)
        for t, device, allocated, reserved in reader.rows(
                "SELECT t, device, allocated, reserved FROM cuda_samples WHERE proc = ?"
                " ORDER BY device, t", (pid,)):
            args = {k: int(v) for k, v in (("allocated", allocated), ("reserved", reserved))
                    if v is not None}
            yield {"ph": "C", "name": f"cuda:{device} memory", "pid": pid, "tid": COUNTERS_TID,
                   "ts": us(t), "args": args}
        for t, device, used in reader.rows(
                "SELECT t, device, used FROM nvml_samples WHERE proc = ? AND used IS NOT NULL"
                " ORDER BY device, t", (pid,)):
            yield {"ph": "C", "name": f"cuda:{device} NVML used", "pid": pid, "tid": COUNTERS_TID,
                   "ts": us(t), "args": {"used": int(used)}}
        yield from _step_blocks(reader, pid, origin, us, statuses)
        for w in reader.step_windows(pid):  # steps a long run folded: one span per window
            wargs: dict[str, Any] = {"first_step": w["first_step"], "last_step": w["last_step"], "steps": w["steps"],
                    "mean_s": w["duration_sum"] / w["steps"], "status": "folded"}
            for key in ("peak_rss", "peak_allocated", "peak_reserved"):
                if w[key] is not None:
                    wargs[key] = int(w[key])
            yield {"ph": "X", "cat": "step", "name": f"steps {w['first_step']}-{w['last_step']}",
                   "pid": pid, "tid": STEPS_TID, "ts": us(w["start"]),
                   "dur": round(max(w["end"] - w["start"], 0.0) * 1e6, 3), "args": wargs}

    events = reader.events()
    known = {p["id"] for p in procs}
    if any(ev["proc"] not in known for ev in events):  # the supervisor's, for the whole run
        yield {"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
               "args": {"name": "memscope (run)"}}
    for ev in events:
        yield _instant(ev, us(ev["t"]), known)


def _sample_blocks(reader: RunReader, pid: int, origin: float,
                   us: Callable[[float], float]) -> Iterator[Block]:
    head = f'{{"ph":"C","name":"host RSS","pid":{pid},"tid":{COUNTERS_TID},"ts":'
    # each event's text made by SQLite, a chunk joined there: ts rounded to the nanosecond by
    # printf (see sql_text: a tie rounds away from zero)
    line = f"printf('{head}%.3f,\"args\":{{\"rss\":%d}}}}', (t - :origin) * 1e6, rss)"
    key = ("t", "rowid")
    try:
        yield from joined_chunks(reader, line, "samples", "proc = :proc", key,
                                 {"origin": origin, "proc": pid}, EVENT_SEP)
        return
    except Unchecked as damaged:
        cond, after = after_key(key, damaged.after)
    # a damaged row ahead: the checked rows say what is wrong (each event as the clean path writes it)
    for t, rss in reader.rows(f"SELECT t, rss FROM samples WHERE proc = ?{cond} ORDER BY t, rowid",
                              (pid, *after)):
        yield f'{head}{us(t):.3f},"args":{{"rss":{int(rss)}}}}}', 1


def _step_blocks(reader: RunReader, pid: int, origin: float, us: Callable[[float], float],
                 statuses: dict[str, str]) -> Iterator[Block]:
    head = '{"ph":"X","cat":"step","name":"step '
    mid = f'","pid":{pid},"tid":{STEPS_TID},"ts":'
    fmt = f'{head}%d{mid}%.3f,"dur":%.3f,"args":{{"step":%d,"status":%s'
    times = "step, (start - :origin) * 1e6, max(end - start, 0.0) * 1e6, step"
    # json_quote() escapes as JSON must (quotes, backslashes, controls); a blob is damage, caught
    # by the checks, but must not stop the query first
    status = "CASE status WHEN 'ok' THEN '\"ok\"' ELSE json_quote(CAST(status AS TEXT)) END"
    extra = " || ".join(f"coalesce(',\"{c}\":' || {c}, '')" for c in PEAKS)
    # one printf for the usual rows (a host peak only, or none); SQLite's max() keeps its first
    # argument on a tie, as Python's does
    line = (f"CASE WHEN peak_allocated IS NULL AND peak_reserved IS NULL THEN CASE WHEN peak_rss IS NULL"
            f" THEN printf('{fmt}}}}}', {times}, {status})"
            f" ELSE printf('{fmt},\"peak_rss\":%d}}}}', {times}, {status}, peak_rss) END"
            f" ELSE printf('{fmt}%s}}}}', {times}, {status}, {extra}) END")
    key = ("step",)
    try:
        yield from joined_chunks(reader, line, "steps", "proc = :proc", key,
                                 {"origin": origin, "proc": pid}, EVENT_SEP)
        return
    except Unchecked as damaged:
        cond, after = after_key(key, damaged.after)

    def quoted(status: str) -> str:
        return statuses.get(status) or statuses.setdefault(status, json.dumps(status))

    for step, start, end, status, *peaks in reader.rows(
            f"SELECT step, start, end, status, {', '.join(PEAKS)} FROM steps"
            f" WHERE proc = ?{cond} ORDER BY step", (pid, *after)):
        extra = "".join(f',"{c}":{int(v)}' for c, v in zip(PEAKS, peaks) if v is not None)
        yield (f'{head}{step}{mid}{us(start):.3f},"dur":{max(end - start, 0.0) * 1e6:.3f},'
               f'"args":{{"step":{step},"status":{quoted(status)}{extra}}}}}'), 1


def _instant(ev: dict[str, Any], ts: float, known: set[int]) -> dict[str, Any]:
    kind = ev["kind"]
    data = ev["data"] if isinstance(ev["data"], dict) else {}
    if kind == "oom":
        name = "OOM"
        if data.get("phase"):
            name += f" in {data['phase']}"
        if data.get("module"):
            name += f" ({data['module']})"
    elif kind == "killed":
        name = f"killed: {ev['message']}" if ev["message"] else "killed"
    else:
        name = f"{kind}: {ev['message']}" if ev["message"] else kind
    args: dict[str, Any] = {"kind": kind, "step": ev["step"], "message": ev["message"]}
    if ev["data"] is not None:
        args["data"] = ev["data"]
    out: dict[str, Any] = {"ph": "i", "cat": kind, "name": name[:200], "ts": ts, "args": args}
    if ev["proc"] in known:
        out.update(pid=int(ev["proc"]), tid=STEPS_TID, s="p")
    else:  # written by the supervisor for the whole run
        out.update(pid=0, tid=0, s="g")
    return out


# the tables a trace is made of: checked whole before its first byte (a trace streamed to stdout
# must not be half written when a damaged value comes up)
TRACE_TABLES = ("run", "processes", "samples", "cuda_samples", "nvml_samples", "steps", "step_windows", "events")


def write_chrome_trace(reader: RunReader, out: TextIO, progress: Callable[[str], None] | None = None) -> int:
    """Write the trace JSON object to ``out``; return the number of events written.
    ``progress`` is told how many events are written, at each write."""
    reader.check_tables(TRACE_TABLES)
    run = reader.run() or {}
    other = {"memscope": __version__, "run_file": reader.path, "command": run.get("command"),
             "started": iso(run.get("started")), "status": run.get("status")}
    out.write('{"displayTimeUnit": "ms", "otherData": ')
    out.write(json.dumps(other))
    out.write(', "traceEvents": [\n')
    n = 0
    chunk: list[str] = []

    def put(text: str | bytes, count: int) -> None:
        nonlocal n
        if n:
            out.write(EVENT_SEP)
        write_chunk(out, text)
        n += count
        if progress is not None:
            progress(f"{n:,} events written")

    for event in chrome_events(reader):
        if isinstance(event, dict):
            chunk.append(json.dumps(event, separators=(",", ":")))
            if len(chunk) >= 4096:  # one write per few thousand events
                put(EVENT_SEP.join(chunk), len(chunk))
                chunk.clear()
            continue
        if chunk:
            put(EVENT_SEP.join(chunk), len(chunk))
            chunk.clear()
        put(*event)
    if chunk:
        put(EVENT_SEP.join(chunk), len(chunk))
    out.write("\n]}\n")
    return n


def _origin(reader: RunReader, run: dict[str, Any] | None) -> float:
    """t = 0: the run's start, else the first thing recorded."""
    if run and run.get("started") is not None:
        return float(run["started"])
    first = reader.scalar("SELECT min(t) FROM samples")
    return float(first) if first is not None else 0.0

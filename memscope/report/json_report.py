"""``memscope report --json``: the ``memscope.report/1`` document of DESIGN.md section 4."""

from __future__ import annotations

from typing import Any

from memscope.analysis.hotspots import (choose_step, closure_forwards, hotspots, layer_rows, micro_batches,
                                        profiled_steps)
from memscope.analysis.ranks import imbalance
from memscope.analysis.suggestions import suggest_for
from memscope.analysis.summary import RunSummary, summarize
from memscope.report.format import iso
from memscope.store.reader import RunReader

SCHEMA = "memscope.report/1"


def build_report(reader: RunReader) -> dict[str, Any]:
    return report_from_summary(summarize(reader))


def report_from_summary(s: RunSummary) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "run": {
            "command": s.command,
            "exit_code": s.exit_code,
            "signal": s.signal,
            "device": s.device,
            "torch": s.torch,
            "steps": s.steps,
            "samples": s.samples,
            "started": iso(s.started),
            "ended": iso(s.ended),
            # additive (DESIGN.md section 4): running | finished | failed | killed | interrupted
            # | abandoned; rows the writer could not keep; why the record is incomplete
            "status": s.status,
            "dropped": s.dropped,
            "recording": s.recording,
            # additive: measurements taken over part of a step, or skipped, and why (one line each)
            "measured": s.measured,
            # additive: techniques attach --try / whatif applied to the script (empty: none)
            "techniques": [{"technique": t["technique"], "applied": t["applied"]} for t in s.techniques],
            # additive: attached to a running process (memscope attach --pid): its pid, when it
            # started, when memscope attached and detached, how it ended; the training's own step
            # count before the attach is unknown (null); null: a run memscope launched
            "attached": _attached(s),
        },
        "peak": {
            "bytes": s.peak.bytes,
            "step": s.peak.step,
            "breakdown": s.peak.breakdown,
        },
        "hotspots": [{"module": h.module, "type": h.type, "activation_bytes": h.activation_bytes,
                      "share": round(h.share, 4)} for h in s.hotspots],
        # additive: the profiled step the hotspots come from and its micro-batches (gradient
        # accumulation: each hotspot is one micro-batch's saving; null: a run file before
        # schema 7, whose hotspots are summed over the step)
        "hotspots_step": s.hotspot_step,
        "hotspots_micro_batches": s.hotspot_micro_batches,
        # additive: how many of those were evaluations of an optimizer's closure (LBFGS)
        "hotspots_closure_forwards": s.hotspot_closure_forwards,
        # Filled by later capabilities (leak detection, OOM post-mortem, suggestions);
        # present now so consumers can rely on the keys.
        "leaks": [lk.as_json() for lk in s.leaks],
        "oom": _oom(s),
        "suggestions": [x.as_json() for x in suggest_for(s)],  # ranked, biggest saving first
        # additive to memscope.report/1: one entry per process; (max - min) / max of their peaks
        "ranks": [r.as_json() for r in s.ranks],
        "rank_imbalance": _round(imbalance(s.ranks)),
        # additive: whether there were enough inventories for the leak verdict ("leaks": [] is
        # only "none" when verdict is "ok"), memory growth no tensor group accounts for, and
        # DataLoader workers' copy-on-read growth (null when not seen)
        "leak_check": s.leak_check.as_json(),
        "unexplained_growth": s.unexplained.as_json() if s.unexplained else None,
        "dataloader_workers": s.workers.as_json() if s.workers else None,
        # additive: hooks registered again and again (a module's, a parameter's, global ones)
        "hook_growth": [h.as_json() for h in s.hooks],
        # additive: every out-of-memory error the run caught, the first (``oom``) in full, the
        # others summarised (a batch-size finder catches several)
        "ooms": ([_oom(s)] + list(s.oom.later)) if s.oom is not None and s.oom.kind == "oom" else [],
    }


def _attached(s: RunSummary) -> dict[str, Any] | None:
    a = s.attached
    if a is None:
        return None
    return {"pid": a.pid, "process_started": iso(a.process_started), "attached": iso(a.attached),
            "detached": iso(a.detached), "ended_how": a.how_it_ended, "steps_before_attach": None}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _oom(s: RunSummary) -> dict[str, Any] | None:
    """An allocator OOM, or a kill that looks like the kernel's OOM killer; else null."""
    r = s.oom
    if r is None or (r.kind == "killed" and not r.data.get("likely_oom_killer")):
        return None
    return r.to_json()


def layers_from(reader: RunReader, summary: RunSummary, step: int | None = None,
                depth: int | None = None) -> dict[str, Any]:
    """``memscope layers --json``: the modules of profiled ``step`` (default: the hotspots' step,
    else the one nearest the peak), folded to ``depth``. ``step`` None in the result: no profile."""
    proc = summary.main_proc
    steps = [st for _, st in profiled_steps(reader, proc)] if proc is not None else []
    if step is None:
        step = summary.hotspot_step if summary.hotspot_step in steps else choose_step(steps, None)
    if step is None or proc is None or step not in steps:
        return {"step": None, "depth": depth, "profiled_steps": steps, "micro_batches": None,
                "closure_forwards": 0, "modules": []}
    rows = layer_rows(reader, proc, step)
    spots = hotspots(rows, depth)
    return {"step": step, "depth": depth, "profiled_steps": steps, "micro_batches": micro_batches(rows),
            "closure_forwards": closure_forwards(reader, proc, step), "modules": [
                {"module": h.module, "type": h.type, "activation_bytes": h.activation_bytes,
                 "share": round(h.share, 4), "output_bytes": h.output_bytes,
                 "forward_s": h.forward_s, "backward_s": h.backward_s, "alloc_peak": h.alloc_peak,
                 "calls": h.calls} for h in spots]}

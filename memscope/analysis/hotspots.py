"""Layer hotspots: which modules' forward code saved the most bytes for backward.

Pure functions over ``layer_stats`` / ``step_breakdown`` rows (no torch). A profiled step has one
row per module that ran; ``saved_bytes`` is what that module's own forward code saved for
backward (its children's savings are their own rows), deduplicated by storage and without
parameters.

With gradient accumulation a step runs several forwards, each followed by its backward (the
micro-batches). Since schema 7 the rows are one of them, not their sum: the micro-batch that
saved the most (a module that did not run in it: its own largest), and ``micro_batches`` says
how many the step had. Older files' rows are sums over the step (``micro_batches`` None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from memscope.store.reader import RunReader


@dataclass
class Hotspot:
    module: str
    type: str | None
    activation_bytes: int
    share: float
    output_bytes: int
    forward_s: float
    calls: int
    backward_s: float | None = None  # None: not measured (schema < 4, or no backward ran)
    alloc_peak: int | None = None  # CUDA: highest allocated bytes inside its forward, over before


def fold_name(module: str, depth: int | None) -> str:
    """The ancestor of ``module`` at ``depth`` dotted components (``blocks.1.attn.qkv`` at
    depth 2 is ``blocks.1``); names no deeper than ``depth`` are unchanged."""
    if depth is None or depth <= 0 or not module:
        return module
    parts = module.split(".")
    return ".".join(parts[:depth]) if len(parts) > depth else module


def hotspots(rows: Iterable[dict[str, Any]], depth: int | None = None) -> list[Hotspot]:
    """Per-module activation bytes of one profiled step, most first, with their share of the
    total. With ``depth``, each module's activation bytes are summed into its ancestor at that
    depth (saved bytes are each module's own, so the sum counts nothing twice). Time, calls and
    output bytes are not summed that way: a module's forward time already includes its
    children's. A folded row is described by the ancestor's own row when it ran; an ancestor
    that never ran itself (a ModuleList) by the topmost descendants folded into it
    (``blocks.0``, ``blocks.1``: not ``blocks.0.attn`` as well, whose time ``blocks.0`` holds)."""
    rows = list(rows)
    by_name = {r["module"]: r for r in rows}
    acc: dict[str, dict[str, Any]] = {}
    for r in rows:
        name = fold_name(r["module"], depth)
        a = acc.get(name)
        if a is None:
            own = by_name.get(name)
            a = acc[name] = {
                "type": own["type"] if own else None,
                "activation_bytes": 0,
                "output_bytes": int(own["output_bytes"] or 0) if own else 0,
                "forward_s": float(own["forward_s"] or 0.0) if own else 0.0,
                "calls": int(own["calls"] or 0) if own else 0,
                "backward_s": own.get("backward_s") if own else None,
                "alloc_peak": own.get("alloc_peak") if own else None,
                "own": own is not None,
            }
        a["activation_bytes"] += int(r["saved_bytes"] or 0)
        if not a["own"] and _topmost_under(r["module"], name, by_name):
            a["output_bytes"] += int(r["output_bytes"] or 0)
            a["forward_s"] += float(r["forward_s"] or 0.0)
            a["calls"] += int(r["calls"] or 0)
            if r.get("backward_s") is not None:
                a["backward_s"] = (a["backward_s"] or 0.0) + float(r["backward_s"])
            if r.get("alloc_peak") is not None:  # folded rows: the largest child peak
                a["alloc_peak"] = max(a["alloc_peak"] or 0, int(r["alloc_peak"]))
    total = sum(a["activation_bytes"] for a in acc.values())
    out = [Hotspot(name, a["type"] or None, a["activation_bytes"],
                   (a["activation_bytes"] / total) if total else 0.0,
                   a["output_bytes"], a["forward_s"], a["calls"], a["backward_s"], a["alloc_peak"])
           for name, a in acc.items()]
    out.sort(key=lambda h: (-h.activation_bytes, h.module))
    return out


def _topmost_under(module: str, folded: str, by_name: dict[str, Any]) -> bool:
    """Whether no ancestor of ``module`` below ``folded`` has a row of its own (that row's
    time and outputs already include ``module``'s)."""
    parts = module.split(".")
    base = len(folded.split(".")) if folded else 0
    return not any(".".join(parts[:i]) in by_name for i in range(base + 1, len(parts)))


def profiled_steps(reader: RunReader, proc: int | None = None) -> list[tuple[int, int]]:
    """(proc, step) of every profiled step, in order."""
    if not _has_table(reader, "layer_stats"):
        return []
    if proc is None:
        rows = reader.query("SELECT DISTINCT proc, step FROM layer_stats ORDER BY proc, step")
    else:
        rows = reader.query("SELECT DISTINCT proc, step FROM layer_stats WHERE proc = ? ORDER BY step",
                            (proc,))
    return [(int(r["proc"]), int(r["step"])) for r in rows]


def choose_step(steps: list[int], near: int | None) -> int | None:
    """The profiled step nearest ``near`` (the earlier one on a tie), else the latest."""
    if not steps:
        return None
    if near is None:
        return steps[-1]
    return min(steps, key=lambda s: (abs(s - near), s))


def micro_batches(rows: Iterable[dict[str, Any]]) -> int | None:
    """How many micro-batches the step of these rows had (each row describes one of them);
    None for a file before schema 7, whose rows are sums over the step."""
    counts = [int(r["micro_batches"]) for r in rows if r.get("micro_batches") is not None]
    return max(counts) if counts else None


def closure_forwards(reader: RunReader, proc: int | None, step: int | None) -> int:
    """How many of the step's micro-batches were forwards inside optimizer.step(): a closure
    the optimizer evaluates again and again (LBFGS), the agent's ``closure`` event, which it
    writes only for two or more (one is Lightning's wrapper); 0 without one."""
    if step is None:
        return 0
    for e in reader.events("closure"):
        d = e["data"] or {}
        if d.get("step") == step and (proc is None or e["proc"] == proc):
            return int(d.get("forwards") or 0)
    return 0


def micro_batch_note(count: int | None, closure: int = 0) -> str:
    """The words that say a table's figures are per micro-batch ("" without accumulation), or
    per evaluation of an optimizer's closure."""
    if count is None or count <= 1:
        return ""
    if closure >= count:
        return f"per forward ({count} evaluations of the optimizer's closure in the step; the one that saved the most)"
    if closure:
        return (f"per micro-batch ({count} in the step, {closure} of them evaluations of the "
                "optimizer's closure; the one that saved the most)")
    return f"per micro-batch ({count} in the step; the one that saved the most)"


COMPILED_TYPES = frozenset({"OptimizedModule"})  # what torch.compile(module) returns


def compiled_note(spots: Sequence[Hotspot], label: Callable[[str], str] = str) -> str:
    """What a table with a ``torch.compile``'d module in it does not show ("" without one): the
    modules inside a compiled graph are not called as modules, so their bytes are the compiled
    module's row (real nanoGPT on a GPU, compiled as it is by default: one row, 100%).
    ``label``: how a module name from the run file is shown (a display's bounded, inert form)."""
    compiled = [label(h.module) if h.module else "(model)" for h in spots if h.type in COMPILED_TYPES]
    if not compiled:
        return ""
    if len(compiled) == 1:
        which = f"{compiled[0]} runs under torch.compile: what its submodules save is its row"
    else:
        which = f"{len(compiled)} modules run under torch.compile: what their submodules save is their rows"
    return (f"{which} (they run inside the compiled graph, not as modules); a run without torch.compile "
            "shows them one by one")


def layer_rows(reader: RunReader, proc: int, step: int) -> list[dict[str, Any]]:
    return reader.query("SELECT * FROM layer_stats WHERE proc = ? AND step = ?", (proc, step))


def breakdown_at(reader: RunReader, proc: int | None, near: int | None,
                 peak_bytes: int | None) -> dict[str, int] | None:
    """``peak.breakdown`` from the profiled step nearest the peak step: parameters, gradients,
    optimizer state, activations, and ``other`` = the peak minus those (at least 0)."""
    if proc is None or not _has_table(reader, "step_breakdown"):
        return None
    rows = reader.query("SELECT * FROM step_breakdown WHERE proc = ? ORDER BY step", (proc,))
    if not rows:
        return None
    step = choose_step([int(r["step"]) for r in rows], near)
    row = next(r for r in rows if r["step"] == step)
    parts = {k: int(row[k] or 0) for k in ("parameters", "gradients", "optimizer_state", "activations")}
    parts["other"] = max(0, int(peak_bytes or 0) - sum(parts.values()))
    return parts


def _has_table(reader: RunReader, name: str) -> bool:
    return bool(reader.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
                              (name,)))

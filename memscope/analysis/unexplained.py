"""Growth nothing explains: the process's memory grows steadily and no tensor group accounts for it.

Pure functions over ``steps`` rows (schema 5: ``end_rss``, ``end_allocated``: memory at the boundary
that closed each step) and ``inventories`` rows. The level is CUDA allocated bytes when the run
used CUDA (tensors live there), else host memory in use at the inventories (schema 13: host RSS
less the free bytes glibc's malloc keeps in its arenas: tensors, Python objects, native buffers,
not the heap a healthy run holds on to while it warms up), else host RSS at every step (another
C library, an older file).

The level's lower envelope (at each step, the lowest level of any later step: what the process
never gives back) over at least ``MIN_STEPS`` steps after warm-up must rise in every quarter of
them, steadily (the last three quarters' rates within 3x of each other, the first's not under a
third of theirs: warm-up growth that levels off, or one jump, is not this; the first may be the
fastest, the allocator warming up on top of a leak), by ``MIN_RATE`` a step (in all and over the
second half alone) and ``MIN_TOTAL`` in all, and not mostly ``JUMPS`` step-to-step rises (a heap
growing in a few jumps while it warms up). From that rate, what the inventories saw tensors grow
by over the same steps is subtracted (four times over on host RSS, for the heap pages a leaked
tensor pins); what is left, when it is at least ``MIN_RATE`` and half the growth, is growth
nothing explains: Python objects piling up (lists of dicts, numpy arrays), native buffers, an
allocator holding on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from memscope.analysis.node_cost import node_cost
from memscope.constants import WARMUP_STEPS
from memscope.units import human_bytes

if TYPE_CHECKING:
    from memscope.analysis.leaks import Leak
    from memscope.store.reader import RunReader

MIN_STEPS = 16  # steps after warm-up, for any verdict (allocator warm-up looks steady for a while)
QUARTERS = 4
MIN_RATE = 64 << 10  # bytes a step
MIN_TOTAL = 1 << 20
UNEXPLAINED_SHARE = 0.5
# Growth that is a few jumps is not steady: a healthy short run's heap grows in steps of 0.5-3 MiB
# while it warms up (a 30-step tiny_gpt under load rose 5.6 MiB in six jumps, one in each quarter).
# A leak adds to the level at most steps, so its largest JUMPS rises are a small part of the total.
JUMPS = 3
JUMP_SHARE = 0.5
# On host RSS a leaked tensor pins the heap pages around it: the C allocator cannot give back the
# freed temporaries interleaved with it, so RSS grows by a multiple of the leaked bytes (3.5x
# measured on examples/leaks/detached_list.py: 113 KiB/step for 32 KiB of tensors). Growth within
# this multiple of what the inventories saw is theirs, not something else's.
RSS_PER_TENSOR_BYTE = 4


@dataclass
class UnexplainedGrowth:
    # "host_in_use" (host RSS less the free bytes malloc keeps, at inventories: glibc, schema 13),
    # "rss" (host resident memory: other C libraries, older files) or "cuda_allocated"
    metric: str
    bytes_per_step: int  # growth of the level's lower envelope
    explained_bytes_per_step: int  # what tensor inventories saw grow over the same steps
    first_step: int
    last_step: int

    @property
    def label(self) -> str:
        """What grew, in words."""
        return {"rss": "host RSS", "host_in_use": "host memory in use"}.get(self.metric, "CUDA allocated memory")

    @property
    def tensor_factor(self) -> int:
        """What a tensor byte is charged on this metric: RSS_PER_TENSOR_BYTE on host RSS (an
        estimate, one measurement), exactly 1 on CUDA and on host memory in use (the heap pages
        a leaked tensor pins hold free chunks, which it leaves out)."""
        return RSS_PER_TENSOR_BYTE if self.metric == "rss" else 1

    @property
    def charged_bytes_per_step(self) -> int:
        """The growth the inventoried tensors account for on this metric."""
        return self.explained_bytes_per_step * self.tensor_factor

    @property
    def unexplained_bytes_per_step(self) -> int:
        return max(self.bytes_per_step - self.charged_bytes_per_step, 0)

    def explained_words(self) -> str:
        """What the inventories account for, saying when the figure rests on the estimate."""
        text = f"+{human_bytes(self.explained_bytes_per_step)}/step of tensors"
        if self.tensor_factor != 1 and self.explained_bytes_per_step:
            text += (f", counted as +{human_bytes(self.charged_bytes_per_step)}/step of RSS "
                     f"({self.tensor_factor}x, an estimate)")
        return text

    def as_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "bytes_per_step": self.bytes_per_step,
                "explained_bytes_per_step": self.explained_bytes_per_step,
                "tensor_factor": self.tensor_factor, "tensor_factor_estimated": self.tensor_factor != 1,
                "charged_bytes_per_step": self.charged_bytes_per_step,
                "unexplained_bytes_per_step": self.unexplained_bytes_per_step,
                "first_step": self.first_step, "last_step": self.last_step}

    def how(self) -> str:
        if self.metric == "cuda_allocated":
            return ("CUDA memory no inventoried tensor holds: look for tensors without a Python "
                    "object kept by C++ (hooks, autograd graphs of detached code, custom extensions) "
                    "with torch.cuda.memory._record_memory_history and _snapshot()")
        return ("memory outside tensors grows: Python objects or native buffers kept every step "
                "(lists of dicts or numpy arrays, caches, logging history); compare "
                "tracemalloc.take_snapshot() at two steps to find the line that allocates them")


def _columns(reader: "RunReader", table: str) -> set[str]:
    return {r["name"] for r in reader.query(f"PRAGMA table_info({table})")}


def level_series(reader: "RunReader", proc: int) -> tuple[str, list[tuple[int, int]]]:
    """(metric, [(step, level at its closing boundary)]) of completed steps."""
    cols = _columns(reader, "steps")
    if "end_rss" not in cols:
        return "rss", []  # a run file from before schema 5
    rows = reader.query("SELECT step, end_rss, end_allocated FROM steps WHERE proc = ? AND status = 'ok' "
                        "ORDER BY step", (proc,))
    if reader.version >= 9:  # a folded window: its lowest level, at its step (the lower envelope)
        rows += reader.query("SELECT end_rss_step AS step, end_rss, NULL AS end_allocated FROM step_windows"
                             " WHERE proc = ? AND end_rss_step IS NOT NULL UNION ALL SELECT"
                             " end_allocated_step, NULL, end_allocated FROM step_windows WHERE proc = ?"
                             " AND end_allocated_step IS NOT NULL", (proc, proc))
        rows.sort(key=lambda r: r["step"])
    if any(r["end_allocated"] is not None for r in rows):
        return "cuda_allocated", [(int(r["step"]), int(r["end_allocated"])) for r in rows
                                  if r["end_allocated"] is not None]
    return "rss", [(int(r["step"]), int(r["end_rss"])) for r in rows if r["end_rss"] is not None]


def steady_growth(levels: list[tuple[int, int]]) -> tuple[float, int, int] | None:
    """(bytes per step, first step, last step) of a steady rise of the lower envelope, or None."""
    found = steady_rise([p for p in levels if p[0] >= WARMUP_STEPS])
    return None if found is None else (found[0], int(found[1]), int(found[2]))


def lower_envelope(levels: Sequence[int]) -> list[int]:
    """At each point, the lowest level of any later point: what the process never gives back."""
    env = [0] * len(levels)
    low: int | None = None
    for i in range(len(levels) - 1, -1, -1):
        low = levels[i] if low is None else min(low, levels[i])
        env[i] = low
    return env


def steady_rise(points: Sequence[tuple[float, int]], min_rate: float = MIN_RATE, min_total: int = MIN_TOTAL,
                min_points: int = MIN_STEPS) -> tuple[float, float, float] | None:
    """The rule on ``points`` (x, level) in increasing x: steps here, seconds for the node's
    samples (memscope.node.growth, with its own floors per second). (bytes per x, first x, last
    x) of a steady rise of the lower envelope over at least ``min_points`` points, or None."""
    if len(points) < min_points:
        return None
    env = lower_envelope([p[1] for p in points])
    cuts = quarter_cuts(len(points))
    return _steady([points[c][0] for c in cuts], [env[c] for c in cuts], min_rate, min_total)


def quarter_cuts(n: int) -> list[int]:
    """Indexes of the points that cut ``n`` points into quarters (the first and last included)."""
    return [(i * (n - 1)) // QUARTERS for i in range(QUARTERS + 1)]


def level_metric(reader: "RunReader", proc: int) -> str:
    """``"cuda_allocated"`` when the run's step boundaries read CUDA allocated bytes, else
    ``"rss"`` (one row looked at)."""
    if "end_rss" not in _columns(reader, "steps"):
        return "rss"  # a run file from before schema 5
    from memscope.store.step_stats import scan_source

    cuda = reader.scalar(f"SELECT count(*) FROM (SELECT 1 FROM {scan_source(reader, 'steps')} WHERE proc = ?"
                         " AND status = 'ok' AND end_allocated IS NOT NULL LIMIT 1)", (proc,))
    return "cuda_allocated" if cuda else "rss"


def steady_growth_of(reader: "RunReader", proc: int) -> tuple[str, tuple[float, int, int] | None]:
    """(metric, :func:`steady_growth` of :func:`level_series`), computed by SQLite: a count,
    then one pass that keeps the lower envelope at the quarter cuts only (a million steps are
    never Python objects): minima over step ranges when the steps are consecutive, else a
    window running back from the last step."""
    if "end_rss" not in _columns(reader, "steps"):
        return "rss", None  # a run file from before schema 5
    from memscope.store.step_stats import scan_source

    src = scan_source(reader, "steps")
    metric = level_metric(reader, proc)
    column = "end_allocated" if metric == "cuda_allocated" else "end_rss"
    where = f"proc = ? AND status = 'ok' AND {column} IS NOT NULL AND step >= ?"
    n, first, last = next(reader.rows(f"SELECT count(*), min(step), max(step) FROM {src} WHERE {where}",
                                      (proc, WARMUP_STEPS)))
    if n < MIN_STEPS:
        return metric, None
    cuts = quarter_cuts(n)
    if last - first + 1 == n:
        # the points are consecutive steps (step numbers are unique): point c is step first + c,
        # and the envelope at each cut is one minimum over the steps from there on, all in one pass
        steps = [first + c for c in cuts]
        lows = ", ".join(f"min(CASE WHEN step >= {s} THEN {column} END)" for s in steps)
        vals = [int(v) for v in next(reader.rows(f"SELECT {lows} FROM {src} WHERE {where}",
                                                 (proc, WARMUP_STEPS)))]
        return metric, _steady(steps, vals)
    # counted from the end: the window runs backwards, so its minimum is the later steps' lowest
    back = {n - c: i for i, c in enumerate(cuts)}
    rows = reader.rows(
        f"SELECT step, low, k FROM (SELECT step, min({column}) OVER w AS low, count(*) OVER w AS k"
        f" FROM steps WHERE {where} WINDOW w AS (ORDER BY step DESC ROWS UNBOUNDED PRECEDING))"
        f" WHERE k IN ({', '.join('?' * len(back))})", (proc, WARMUP_STEPS, *back))
    at = {back[int(k)]: (int(step), int(low)) for step, low, k in rows}
    if len(at) != len(back):
        return metric, None  # the table changed between the two reads (a live run): next time
    return metric, _steady([at[i][0] for i in range(len(at))], [at[i][1] for i in range(len(at))])


def _steady(steps: Sequence[float], vals: list[int], min_rate: float = MIN_RATE,
            min_total: int = MIN_TOTAL) -> tuple[float, Any, Any] | None:
    """The verdict from the lower envelope ``vals`` at the quarter cuts ``steps``."""
    if any(b <= a for a, b in zip(vals, vals[1:])) or any(b <= a for a, b in zip(steps, steps[1:])):
        return None
    rates = [(vals[i + 1] - vals[i]) / (steps[i + 1] - steps[i]) for i in range(QUARTERS)]
    # not steady: warm-up levelling off, a one-time jump. The first quarter may be faster than
    # the rest (the allocator warming up on top of a leak: a 20-step numpy_history run under load
    # rose 460, 147, 266, 205 KiB a step), never slower than a third of them.
    later = rates[1:]
    if min(later) < max(later) / 3 or rates[0] < max(later) / 3:
        return None
    total = vals[-1] - vals[0]
    rate = total / (steps[-1] - steps[0])
    if rate < min_rate or total < min_total:
        return None
    # the rise must hold at the floor in the second half too: warm-up that slows below it there is
    # levelling off (a healthy 45-step run under load rose 200, 62, 36, 24 KiB a step by quarters:
    # within 3x of each other, 78 KiB a step in all, 30 in its second half)
    half = QUARTERS // 2
    if (vals[-1] - vals[half]) / (steps[-1] - steps[half]) < min_rate:
        return None
    return rate, steps[0], steps[-1]


def _tensor_rate(reader: "RunReader", proc: int, first: int, last: int) -> float:
    """What the inventories saw tensors (and retained graphs) grow by per step, from the
    inventory nearest ``first`` to the last one at or before ``last``."""
    cols = _columns(reader, "inventories")
    if not cols:
        return 0.0
    nodes = "coalesce(graph_nodes, 0)" if "graph_nodes" in cols else "0"
    rows = reader.query(f"SELECT step, bytes + graph_bytes + {nodes} * ? AS size FROM inventories "
                        "WHERE proc = ? AND step >= ? AND step <= ? ORDER BY step",
                        (node_cost(reader, proc).bytes, proc, first, last))
    if len(rows) < 2 or rows[-1]["step"] <= rows[0]["step"]:
        return 0.0
    return float((rows[-1]["size"] - rows[0]["size"]) / (rows[-1]["step"] - rows[0]["step"]))


def in_use_series(reader: "RunReader", proc: int) -> list[tuple[int, int]]:
    """(step, host memory in use) at each inventory after warm-up: the level (host RSS at the
    boundary) less the free bytes malloc's arenas kept then. [] without those readings (not
    glibc, a file before schema 13) or on a CUDA run (the level is CUDA bytes there)."""
    if "heap_free" not in _columns(reader, "inventories"):
        return []
    rows = reader.query("SELECT step, level, heap_free FROM inventories WHERE proc = ? AND step >= ?"
                        " AND level > 0 AND heap_free IS NOT NULL ORDER BY step", (proc, WARMUP_STEPS))  # 0: RSS unread
    return [(int(r["step"]), int(r["level"]) - int(r["heap_free"])) for r in rows]


def _in_use_growth(points: list[tuple[int, int]]) -> tuple[float, int, int] | None:
    """The rule on host memory in use at the inventories (points far apart late in a run: a
    rise between two of them is no one-step jump, but a few of them still make no growth)."""
    found = steady_rise(points)
    if found is None:
        return None
    rate, first, last = found
    levels = {step: level for step, level in points}
    span = [p for p in points if first <= p[0] <= last]
    rises = [b[1] - a[1] for a, b in zip(span, span[1:])]
    if mostly_jumps(rises, levels[int(last)] - levels[int(first)]):
        return None
    return rate, int(first), int(last)


def unexplained_growth(reader: "RunReader", proc: int | None,
                       leaks: Sequence["Leak"] = ()) -> UnexplainedGrowth | None:
    """Steady growth of the process's memory that no tensor group accounts for. On host RSS, a
    tensor leak reported over the same steps accounts for it: the heap pages its tensors pin and
    the C++ autograd nodes its graphs keep cost a multiple of their bytes that varies from run
    to run (3.5x to 10x measured), so what is left cannot be told apart from it (one leak, one
    report; growth beyond it shows once it is fixed)."""
    if proc is None:
        return None
    points = in_use_series(reader, proc) if level_metric(reader, proc) == "rss" else []
    if len(points) >= MIN_STEPS:
        # judged on memory in use: RSS a healthy run's heap keeps free while it warms up (2-4 MiB
        # over 40 steps under load, malloc's in-use bytes flat) is not growth, and a leak whose
        # arrays reuse that free memory (RSS flat for steps on end) is; the pass over every
        # step's level is not made
        metric, found = "host_in_use", _in_use_growth(points)
    else:
        metric, found = steady_growth_of(reader, proc)
        if found is not None and few_jumps(reader, proc, metric, found[1], found[2]):
            return None
    if found is None:
        return None
    rate, first, last = found
    if metric != "cuda_allocated" and any(lk.first_step <= last and lk.last_step >= first for lk in leaks):
        return None
    explained = max(_tensor_rate(reader, proc, first, last), 0.0)
    if not is_unexplained(metric, rate, explained):
        return None
    return UnexplainedGrowth(metric, int(round(rate)), int(round(explained)), first, last)


def few_jumps(reader: "RunReader", proc: int, metric: str, first: int, last: int) -> bool:
    """Whether the level's rise from ``first`` to ``last`` is mostly ``JUMPS`` step-to-step
    jumps (heap growth while warming up), not growth spread over the steps. Asked only of a run
    whose envelope rose steadily, so the one pass over its steps is rare."""
    column = "end_allocated" if metric == "cuda_allocated" else "end_rss"
    rows = reader.rows(
        f"SELECT d FROM (SELECT {column} - lag({column}) OVER (ORDER BY step) AS d FROM steps"
        f" WHERE proc = ? AND status = 'ok' AND {column} IS NOT NULL AND step >= ? AND step <= ?)"
        " WHERE d > 0 ORDER BY d DESC LIMIT ?", (proc, first, last, JUMPS))
    rises = [int(r[0]) for r in rows]
    ends = reader.rows(f"SELECT {column} FROM steps WHERE proc = ? AND status = 'ok' AND {column} IS NOT NULL"
                       " AND step IN (?, ?) ORDER BY step", (proc, first, last))
    levels = [int(r[0]) for r in ends]
    return mostly_jumps(rises, levels[-1] - levels[0] if len(levels) == 2 else 0)


def mostly_jumps(rises: Sequence[int], total: int) -> bool:
    """Whether the ``JUMPS`` largest of the point-to-point ``rises`` make at least ``JUMP_SHARE``
    of the ``total`` rise (a heap growing in a few jumps while it warms up, not a leak)."""
    top = sum(sorted((r for r in rises if r > 0), reverse=True)[:JUMPS])
    return total > 0 and top >= JUMP_SHARE * total


def is_unexplained(metric: str, rate: float, explained: float) -> bool:
    """Whether growth of ``rate`` bytes a step is more than tensors growing by ``explained``
    account for: at least ``MIN_RATE`` and half of it left over, after charging the tensors
    ``RSS_PER_TENSOR_BYTE`` times their bytes on host RSS (exactly their bytes on CUDA and on
    host memory in use)."""
    charged = explained * (RSS_PER_TENSOR_BYTE if metric == "rss" else 1)  # exact on memory in use
    left = rate - charged
    return left >= MIN_RATE and left >= UNEXPLAINED_SHARE * rate


def suggestion(u: UnexplainedGrowth, steps: int) -> dict[str, Any]:
    """A ``fix_leak`` suggestion: what the unexplained growth accumulates over a run this long."""
    metric = u.label
    return {"technique": "fix_leak",
            "estimated_saving_bytes": int(u.unexplained_bytes_per_step * max(steps, 0)),
            "evidence": (f"{metric} grows by {human_bytes(u.bytes_per_step)}/step from step "
                         f"{u.first_step} to {u.last_step}; tensor inventories account for "
                         f"{u.explained_words()}"),
            "how": u.how()}

"""Per-rank facts of a distributed run: each process's steps, peak and whether it ran out of memory.

Pure reading of ``processes`` / ``steps`` / ``samples`` / ``cuda_samples`` / ``events`` (no torch).
One :class:`RankSummary` per recorded process; a run without ``torchrun`` has one, with
``rank = None``.

The peak uses the run-wide metric of :func:`memscope.analysis.summary.find_peak`: CUDA allocated
bytes when the run has CUDA samples, else host RSS; the per-step peak first (the earliest step on
a tie), the highest sample when the process completed no step with a reading.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from memscope.analysis.step_windows import median_with_windows
from memscope.store.reader import RunReader
from memscope.store.step_stats import StepStats, median_step_s, peak_step, step_stats


@dataclass
class RankSummary:
    rank: int | None
    local_rank: int | None
    host: str | None
    proc: int  # processes.id: the ``proc`` of this rank's rows
    steps: int  # completed steps
    peak_bytes: int | None
    peak_step: int | None  # None: the peak came from a sample outside any completed step
    median_step_s: float | None
    status: str  # the process row's status: running | stopped | lost
    oom: bool  # this process recorded an out-of-memory error

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        if d["median_step_s"] is not None:
            d["median_step_s"] = round(d["median_step_s"], 6)
        return d


def rank_summaries(reader: RunReader, stats: dict[int, StepStats] | None = None) -> list[RankSummary]:
    """One summary per process, by rank (processes without a rank last), then host and id.
    ``stats``: :func:`step_stats` of the reader, when the caller has it already."""
    procs = reader.processes()
    cuda = bool(reader.scalar("SELECT count(*) FROM (SELECT 1 FROM cuda_samples LIMIT 1)"))
    column = "peak_allocated" if cuda else "peak_rss"
    oom_procs = {e["proc"] for e in reader.events("oom") if e["proc"] is not None}
    folded = reader.folded_steps()
    out: list[RankSummary] = []
    stats = step_stats(reader) if stats is None else stats
    for p in procs:
        st = stats.get(p["id"])
        peak = st.peak(column, with_failed=False) if st else None
        step = peak_step(reader, p["id"], column, peak, with_failed=False) if peak is not None else None
        if peak is None:
            peak = _sample_peak(reader, p["id"], cuda)
        ok = st.ok if st else 0
        out.append(RankSummary(
            rank=p["rank"], local_rank=p["local_rank"], host=p["host"], proc=int(p["id"]),
            steps=ok + folded.get(int(p["id"]), 0), peak_bytes=peak, peak_step=step,
            median_step_s=median_with_windows(reader, int(p["id"]), ok) if p["id"] in folded
            else median_step_s(reader, p["id"], ok),
            status=p["status"], oom=p["id"] in oom_procs))
    out.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.host or "", r.proc))
    return out


def imbalance(ranks: Sequence[RankSummary]) -> float | None:
    """How far the lightest rank's peak falls below the heaviest's: ``(max - min) / max``.

    0.0 is perfectly balanced; 0.25 means the lightest rank peaked 25% lower than the heaviest.
    Chosen over ``max / min`` because it stays in [0, 1] and is defined when a rank peaked at 0.
    None with fewer than two ranks that have a peak, or when every peak is 0.
    """
    peaks = [r.peak_bytes for r in ranks if r.peak_bytes is not None]
    if len(peaks) < 2 or max(peaks) <= 0:
        return None
    return (max(peaks) - min(peaks)) / max(peaks)


def heaviest(ranks: Sequence[RankSummary]) -> RankSummary | None:
    """The rank with the highest peak (the first on a tie), or None."""
    with_peak = [r for r in ranks if r.peak_bytes is not None]
    return max(with_peak, key=lambda r: r.peak_bytes or 0) if with_peak else None


def lightest(ranks: Sequence[RankSummary]) -> RankSummary | None:
    """The rank with the lowest peak (the first on a tie), or None."""
    with_peak = [r for r in ranks if r.peak_bytes is not None]
    return min(with_peak, key=lambda r: r.peak_bytes or 0) if with_peak else None


def _sample_peak(reader: RunReader, proc: int, cuda: bool) -> int | None:
    if cuda:
        v = reader.scalar("SELECT max(allocated_peak) FROM cuda_samples WHERE proc = ?", (proc,))
    else:
        v = reader.scalar("SELECT max(rss) FROM samples WHERE proc = ?", (proc,))
    return int(v) if v is not None else None

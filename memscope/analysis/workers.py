"""DataLoader workers' host memory: copy-on-read growth of Python-object datasets.

Pure functions over ``worker_samples`` rows (schema 5), written by the ``attach`` supervisor from
outside the training (``memscope.runners.workers``): the unique (USS) and proportional (PSS) set
sizes of each child process of a training process that is not itself recorded, i.e. its
DataLoader workers.

A forked worker shares the parent's pages until it writes to them; reading a Python object
writes its reference count, so a worker that walks a dataset held as lists / dicts of Python
objects slowly copies all of it (pytorch/pytorch#13246): each worker's USS climbs towards the
dataset's size, and the machine's memory by that times the number of workers. A worker whose USS
grows by ``MIN_GROWTH`` or more (and by half its first reading), gradually (no single jump between
two samples makes most of it: one large allocation is not this), is reported; the fix is to hold
the data in a few large buffers (numpy arrays, Arrow, tensors), whose pages nobody writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memscope.units import human_bytes

if TYPE_CHECKING:
    from memscope.store.reader import RunReader

MIN_SAMPLES = 4
MIN_GROWTH = 32 << 20


@dataclass
class WorkerGrowth:
    workers: int  # workers whose private memory grew
    of_workers: int  # workers sampled
    uss_start: int  # summed over the growing workers, at their first sample
    uss_end: int  # ... and at their last
    seconds: float  # from the first to the last sample of the growing workers
    steps: int | None  # training steps completed meanwhile (None: not known)
    pss_end: int | None = None

    @property
    def bytes_per_step(self) -> int | None:
        if not self.steps:
            return None
        return int((self.uss_end - self.uss_start) / self.steps)

    def as_json(self) -> dict[str, Any]:
        return {"workers": self.workers, "of_workers": self.of_workers,
                "uss_start": self.uss_start, "uss_end": self.uss_end, "pss_end": self.pss_end,
                "seconds": round(self.seconds, 3), "steps": self.steps,
                "bytes_per_step": self.bytes_per_step}

    @staticmethod
    def how() -> str:
        return ("DataLoader workers copy the dataset as they read it (copy-on-read of Python objects "
                "in forked workers, pytorch/pytorch#13246): hold the data in numpy arrays, Arrow "
                "tables or tensors instead of lists / dicts of Python objects (strings too: one "
                "numpy array of offsets and one of bytes), or lower num_workers")


def _has_table(reader: "RunReader") -> bool:
    return bool(reader.scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'worker_samples'"))


def worker_growth(reader: "RunReader") -> WorkerGrowth | None:
    if not _has_table(reader):
        return None
    rows = reader.query("SELECT proc, pid, t, uss, pss FROM worker_samples WHERE uss IS NOT NULL "
                        "ORDER BY proc, pid, t")
    # a multiprocessing child that trains (an agent_missing event names it) is no DataLoader
    # worker: its growth is the training's, not copy-on-read
    trainers = {e["data"].get("pid") for e in reader.events("agent_missing") if isinstance(e["data"], dict)}
    by: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r["pid"] not in trainers:
            by.setdefault((r["proc"], r["pid"]), []).append(r)
    grew = [(key, s) for key, s in by.items() if _grows([int(x["uss"]) for x in s])]
    if not grew:
        return None
    t0 = min(s[0]["t"] for _, s in grew)
    t1 = max(s[-1]["t"] for _, s in grew)
    procs = {key[0] for key, _ in grew}
    steps = reader.scalar(
        "SELECT count(*) FROM steps WHERE status = 'ok' AND end > ? AND end <= ? AND proc IN (%s)"
        % ",".join("?" * len(procs)), (t0, t1, *procs))
    if reader.version >= 9:  # folded steps: a window counts when its last step ended in the span
        steps = (steps or 0) + (reader.scalar(
            "SELECT coalesce(sum(steps), 0) FROM step_windows WHERE end > ? AND end <= ? AND proc IN (%s)"
            % ",".join("?" * len(procs)), (t0, t1, *procs)) or 0)
    pss = [s[-1]["pss"] for _, s in grew]
    return WorkerGrowth(
        workers=len(grew), of_workers=len(by),
        uss_start=sum(int(s[0]["uss"]) for _, s in grew),
        uss_end=sum(max(int(x["uss"]) for x in s) for _, s in grew),
        seconds=float(t1 - t0), steps=int(steps) if steps else None,
        pss_end=sum(int(p) for p in pss) if all(p is not None for p in pss) else None)


def _grows(uss: list[int]) -> bool:
    """Grew by MIN_GROWTH and half its first reading, gradually (not one allocation: no single
    increase between two samples makes most of it); it may level off once all is copied."""
    if len(uss) < MIN_SAMPLES:
        return False
    total = max(uss) - uss[0]
    if total < max(MIN_GROWTH, uss[0] // 2):
        return False
    jumps = [b - a for a, b in zip(uss, uss[1:])]
    return max(jumps) < 0.8 * total


def suggestion(w: WorkerGrowth) -> dict[str, Any]:
    """A ``fix_leak`` suggestion: the memory the workers' copies took."""
    per_step = f" (~{human_bytes(w.bytes_per_step)}/step)" if w.bytes_per_step else ""
    return {"technique": "fix_leak",
            "estimated_saving_bytes": max(w.uss_end - w.uss_start, 0),
            "evidence": (f"{w.workers} of {w.of_workers} DataLoader worker(s) grew their private "
                         f"memory (USS) from {human_bytes(w.uss_start)} to {human_bytes(w.uss_end)} "
                         f"in {w.seconds:.0f} s{per_step}"),
            "how": w.how()}

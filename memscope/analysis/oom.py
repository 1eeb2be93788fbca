"""Out-of-memory post-mortem of a run: pure reading of the ``events`` rows (no torch).

The agent writes an ``oom`` event when it sees an out-of-memory error (memscope.agent.oom); the
supervisor writes a ``killed`` event when the process died by a signal; ``memscope import``
turns a CUDA snapshot's ``oom`` trace entry into an ``oom`` event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memscope.store.reader import RunReader

ABSURD_REQUEST = 1024 ** 4  # more than any device has: a shape bug, not a tight budget


@dataclass
class OomReport:
    kind: str  # "oom" (an allocator error) or "killed" (died by a signal)
    step: int | None
    phase: str | None
    module: str | None
    requested_bytes: int | None
    live_bytes: int | None
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    others: int = 0  # further OOM events after the first
    proc: int | None = None  # the process that recorded it
    rank: int | None = None  # its distributed rank (None outside torchrun)

    def to_json(self) -> dict[str, Any]:
        """The ``oom`` object of ``memscope.report/1`` (DESIGN.md section 4)."""
        return {"step": self.step, "phase": self.phase, "module": self.module,
                "requested_bytes": self.requested_bytes, "live_bytes": self.live_bytes,
                "message": self.message, "rank": self.rank}


def post_mortem(reader: RunReader) -> OomReport | None:
    """The first OOM of the run, else the signal that killed it, else None."""
    ooms = reader.events("oom")
    if ooms:
        ev = ooms[0]
        d = ev["data"] if isinstance(ev["data"], dict) else {}
        return OomReport(kind="oom", step=_int(d.get("step", ev["step"])), phase=d.get("phase") or "other",
                         module=d.get("module"), requested_bytes=_int(d.get("requested_bytes")),
                         live_bytes=_int(d.get("live_bytes")),
                         message=d.get("message") or ev["message"] or "out of memory",
                         data=d, others=len(ooms) - 1, proc=ev["proc"], rank=_rank_of(reader, ev["proc"]))
    killed = reader.events("killed")
    if killed:
        ev = killed[-1]
        d = ev["data"] if isinstance(ev["data"], dict) else {}
        return OomReport(kind="killed", step=_int(d.get("step", ev["step"])), phase=None, module=None,
                         requested_bytes=None, live_bytes=_int(d.get("last_rss")),
                         message=ev["message"] or "killed by a signal", data=d,
                         proc=ev["proc"], rank=_rank_of(reader, ev["proc"]))
    return None


def advice(r: OomReport) -> list[str]:
    """What to change, in a few generic lines suited to where it failed."""
    if r.requested_bytes is not None and r.requested_bytes > ABSURD_REQUEST:
        return ["a shape bug: the request is larger than any device; check the sizes that "
                f"{r.module or 'the failing code'} computes (a wrong dimension or a missing reshape)"]
    if r.kind == "killed":
        if r.data.get("likely_oom_killer"):
            return ["host memory ran out: load data lazily or memory-map it, use fewer DataLoader "
                    "workers, avoid keeping tensors or losses of every step (use loss.item())"]
        return ["the process was killed from outside; if it was for memory, check the last samples "
                "against the machine's (or the job's cgroup) limit"]
    if r.phase == "backward":
        return ["activation checkpointing (recompute in backward instead of keeping activations)",
                "a smaller micro-batch with gradient accumulation",
                "mixed precision (bf16/fp16 activations and gradients)"]
    if r.phase == "optimizer":
        return ["a lighter optimizer (SGD with momentum, Adafactor, 8-bit Adam)",
                "shard optimizer state (ZeRO / FSDP) or offload it to the CPU"]
    if r.phase == "forward":
        return ["activation checkpointing on the largest blocks",
                "a smaller micro-batch with gradient accumulation",
                "mixed precision (bf16/fp16)"]
    return ["a smaller batch, mixed precision, or checkpointing; see memscope report for the peak"]


def _rank_of(reader: RunReader, proc: int | None) -> int | None:
    if proc is None:
        return None
    return _int(reader.scalar("SELECT rank FROM processes WHERE id = ?", (proc,)))


def _int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None

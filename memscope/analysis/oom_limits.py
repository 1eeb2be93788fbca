"""Which memory limit an out-of-memory error ran into, and hints that follow from the failure.

A CPU process fails an allocation at the first of: the address-space rlimit (``ulimit -v``,
counted against virtual size), its cgroup's ``memory.max``, the machine's memory. A CUDA one at
``--simulate-gpu``'s cap, a per-process memory fraction, or the device's memory. The agent
records the limits in force at the failure (``limits``, memscope.agent.collectors.oom); this decides which
one failed, from the usage it recorded and the request. Pure: no torch.
"""

from __future__ import annotations

from typing import Any

from memscope.units import human_bytes

LIMIT_NAMES = {
    "RLIMIT_AS": "RLIMIT_AS (ulimit -v, counted against virtual size)",
    "cgroup_memory_max": "the cgroup's memory.max",
    "host_memory": "the machine's memory",
    "simulate_gpu": "--simulate-gpu",
    "memory_fraction": "the per-process memory fraction (torch.cuda.set_per_process_memory_fraction)",
    "cuda_device": "the CUDA device's memory",
}
SCORES_SHARE = 0.3  # attention scores at least this share of the activations: say so


def failed_limit(d: dict[str, Any]) -> dict[str, Any] | None:
    """``{"kind", "bytes", "used_bytes"}`` of the limit the failing request went over (the
    tightest one when none is over by the record's figures), None when nothing is known."""
    limits = {k: v for k, v in (d.get("limits") or {}).items() if _int(v)} if isinstance(d.get("limits"), dict) else {}
    device = str(d.get("device") or "cpu")
    requested = _int(d.get("requested_bytes")) or 0
    if device.startswith("cuda"):
        used = _int(d.get("reserved_bytes")) or _int(d.get("allocated_bytes")) or _int(d.get("live_bytes"))
        total = _int(d.get("device_total_bytes")) or _int(d.get("nvml_total_bytes"))
        frac = _int(d.get("device_limit_bytes"))
        if limits.get("simulate_gpu"):
            return _limit("simulate_gpu", int(limits["simulate_gpu"]), used)
        if frac and total and frac < total:
            return _limit("memory_fraction", frac, used)
        return _limit("cuda_device", total, used) if total else None
    rss, vms = _int(d.get("rss")), _int(d.get("vms"))
    candidates = []
    if limits.get("RLIMIT_AS"):
        candidates.append(("RLIMIT_AS", int(limits["RLIMIT_AS"]), max(vms or 0, rss or 0) or None))
    for kind in ("cgroup_memory_max", "host_memory"):
        if limits.get(kind):
            candidates.append((kind, int(limits[kind]), rss))
    if not candidates and _int(d.get("host_total_bytes")):
        candidates.append(("host_memory", int(d["host_total_bytes"]), rss))
    for kind, limit, used in candidates:
        if used is not None and used + requested > limit:
            return _limit(kind, limit, used)
    known = [c for c in candidates if c[2] is not None]
    if known:
        kind, limit, used = min(known, key=lambda c: c[1] - (c[2] or 0))
        return _limit(kind, limit, used)
    return _limit(*candidates[0]) if candidates else None


def _limit(kind: str, limit: int | None, used: int | None = None) -> dict[str, Any] | None:
    if not limit:
        return None
    return {"kind": kind, "bytes": int(limit), "used_bytes": used}


def limit_line(limit: dict[str, Any], requested: int | None) -> str:
    """The limit in words: which, how much, and what went over it."""
    kind = str(limit.get("kind"))
    text = f"{LIMIT_NAMES.get(kind, kind)}: {human_bytes(limit.get('bytes'))}"
    used = _int(limit.get("used_bytes"))
    if used is not None:
        what = "virtual size" if kind == "RLIMIT_AS" else "reserved" if kind in (
            "simulate_gpu", "memory_fraction", "cuda_device") else "RSS"
        text += f" (the process's {what} {human_bytes(used)}"
        if not requested:
            return text + ")"
        total, bound = used + requested, _int(limit.get("bytes")) or 0
        text += f" + the request {human_bytes(requested)} = {human_bytes(total)}"
        if total > bound:
            return text + f", over it by {human_bytes(total - bound)})"
        # read after the failure: what the failing moment held was partly freed by then
        return text + (f", {human_bytes(bound - total)} under it by these figures: the {what} was "
                       "read after the failure, when part of what the failing step held was freed)")
    return text


def attention_scores(d: dict[str, Any]) -> int:
    """Bytes of attention score tensors (N x N per head) saved at the failure (the census)."""
    census = d.get("census")
    return (_int(census.get("attention_scores")) or 0) if isinstance(census, dict) else 0


def attention_tip(d: dict[str, Any], activations: int) -> str | None:
    """Advice when N x N attention scores are a large part of the activations at the failure."""
    scores = attention_scores(d)
    if not activations or scores < SCORES_SHARE * activations:
        return None
    return (f"attention scores {human_bytes(scores)} ({scores / activations:.0%} of the activations "
            "live at the failure: N x N per head, kept by the softmax, its dropout and scores @ v): "
            "efficient attention (torch.nn.functional.scaled_dot_product_attention, FlashAttention) "
            "never stores them; move the Dropout on the scores into its dropout_p")


def profile_hint(steps: int | None, oom_step: int | None, running: bool = False) -> str:
    """The attach option that would have profiled the layers of this run: step 0 is profiled
    only with ``--layers-first 0`` (a run that failed or ended in step 0 has no step 1). A run
    that completed no step, and did not fail in one, had no step to profile: no option helps."""
    if oom_step is None and not steps:
        if running:
            return "no training step has completed yet"
        return ("it completed no training step (a step ends at optimizer.step(), or at a backward "
                "without an optimizer), so there was none to profile")
    if (oom_step is not None and oom_step < 1) or (steps is not None and steps < 2):
        return "attach with --layers-first 0 to profile step 0"
    return "attach with --layers-every N"


def _int(v: Any) -> int | None:
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError, OverflowError):
        return None

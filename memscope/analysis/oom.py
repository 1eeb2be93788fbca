"""Out-of-memory post-mortem of a run: pure reading of the ``events`` rows (no torch).

The agent writes an ``oom`` event when it sees an out-of-memory error (memscope.agent.collectors.oom), with
what was live at the failure (an at-failure census) or, when the census could not run, the last
profiled step's breakdown; the supervisor writes a ``killed`` event when the process died by a
signal; ``memscope import`` turns a CUDA snapshot's ``oom`` trace entry into an ``oom`` event.

:func:`facts` turns a post-mortem into labelled lines (the CLI and the dashboard print them):
every fact the record holds appears, so ``memscope oom`` says what ``--json`` says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from memscope.analysis.oom_limits import attention_tip, failed_limit, limit_line
from memscope.display import shown_text
from memscope.store.reader import RunReader
from memscope.units import human_bytes

ABSURD_REQUEST = 1024 ** 4  # more than any device has: a shape bug, not a tight budget
FRAGMENTED_SHARE = 0.10  # inactive split bytes at least this share of reserved: fragmented
OUTSIDE_SHARE = 0.10  # device memory outside PyTorch at least this share of the device: say so
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")
MAX_LATER = 10  # later out-of-memory errors listed one a line by ``memscope oom``


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
    later: list[dict[str, Any]] = field(default_factory=list)  # those, summarised (summary_json)
    proc: int | None = None  # the process that recorded it
    rank: int | None = None  # its distributed rank (None outside torchrun)

    @property
    def breakdown(self) -> dict[str, int] | None:
        """Parameters, gradients, optimizer state, activations, other: what was live at the
        failure (``breakdown_at_failure``), else at the last profiled step before it."""
        bd = self.data.get("breakdown")
        if not isinstance(bd, dict):
            return None
        out = {k: _int(bd.get(k)) for k in CATEGORIES}
        return {k: v for k, v in out.items() if v is not None} or None

    @property
    def breakdown_step(self) -> int | None:
        bd = self.data.get("breakdown")
        step = self.data.get("breakdown_step")
        if step is None and isinstance(bd, dict):  # records written before breakdown_step
            step = bd.get("step")
        return _int(step)

    @property
    def breakdown_at_failure(self) -> bool:
        return bool(self.data.get("breakdown_at_failure")) and self.breakdown is not None

    @property
    def activations_by_module(self) -> list[dict[str, Any]]:
        rows = self.data.get("activations_by_module")
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []

    @property
    def limit(self) -> dict[str, Any] | None:
        """The memory limit the failure ran into (memscope.analysis.oom_limits)."""
        return failed_limit(self.data) if self.kind == "oom" else None

    @property
    def evaluation(self) -> bool:
        """An evaluation that ran with autograd on: the failing model was in eval mode and the
        census found activations saved for backward (a backward that never comes)."""
        return (self.kind == "oom" and self.phase == "forward" and self.data.get("training") is False
                and self.breakdown_at_failure and (self.breakdown or {}).get("activations", 0) > 0)

    def to_json(self) -> dict[str, Any]:
        """The ``oom`` object of ``memscope.report/1`` (DESIGN.md section 4); ``limit``
        (``{"kind", "bytes", "used_bytes"}``) is additive."""
        return {"step": self.step, "phase": self.phase, "module": self.module,
                "requested_bytes": self.requested_bytes, "live_bytes": self.live_bytes,
                "message": self.message, "rank": self.rank,
                "breakdown": self.breakdown, "breakdown_step": self.breakdown_step,
                "limit": self.limit}


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
                         data=d, others=len(ooms) - 1, proc=ev["proc"], rank=_rank_of(reader, ev["proc"]),
                         later=[summary_json(e) for e in ooms[1:]])
    killed = reader.events("killed")
    if killed:
        ev = killed[-1]
        d = ev["data"] if isinstance(ev["data"], dict) else {}
        return OomReport(kind="killed", step=_int(d.get("step", ev["step"])), phase=None, module=None,
                         requested_bytes=None, live_bytes=_int(d.get("last_rss")),
                         message=ev["message"] or "killed by a signal", data=d,
                         proc=ev["proc"], rank=_rank_of(reader, ev["proc"]))
    return None


def summary_json(ev: dict[str, Any]) -> dict[str, Any]:
    """An out-of-memory error after the first, in a few facts (``report --json``'s ``ooms``)."""
    d = ev["data"] if isinstance(ev.get("data"), dict) else {}
    return {"step": _int(d.get("step", ev.get("step"))), "phase": d.get("phase") or "other",
            "module": d.get("module"), "requested_bytes": _int(d.get("requested_bytes")),
            "live_bytes": _int(d.get("live_bytes")),
            "message": d.get("message") or ev.get("message") or "out of memory"}


def later_line(o: dict[str, Any]) -> str:
    where = f"step {o['step']}" if o.get("step") is not None else "outside any step"
    where += f", {o.get('phase') or 'other'}"
    if o.get("module") is not None:
        where += f", in module {o['module'] or '(the model itself)'}"
    return (f"{where}: requested {human_bytes(o.get('requested_bytes'))} with "
            f"{human_bytes(o.get('live_bytes'))} live: {o.get('message')}")


def demand(r: OomReport) -> dict[str, int] | None:
    """What the failing moment needed, by category: the breakdown live at the failure plus the
    request that did not fit, counted where it belongs (in forward and backward an activation
    or a gradient buffer of the batch, both scaling with it: ``activations``; in the optimizer
    step ``optimizer_state``). None without an at-failure breakdown; a shape bug's absurd
    request is not added."""
    if r.kind != "oom" or not r.breakdown_at_failure:
        return None
    out = dict(r.breakdown or {})
    req = r.requested_bytes
    if req is not None and req <= ABSURD_REQUEST and r.phase in ("forward", "backward", "optimizer"):
        key = "optimizer_state" if r.phase == "optimizer" else "activations"
        out[key] = out.get(key, 0) + req
    return out


def fragmentation(d: dict[str, Any]) -> dict[str, Any] | None:
    """Whether the CUDA cache was fragmented at the failure, from the allocator's state:
    ``blocked`` when the cache held enough free bytes for the request but no block that large
    (the OOM is fragmentation's doing), ``split_share`` of reserved stranded in split blocks."""
    reserved = _int(d.get("reserved_bytes"))
    split = _int(d.get("inactive_split_bytes"))
    cached_free = _int(d.get("cached_free_bytes"))
    largest = _int(d.get("largest_free_block_bytes"))
    requested = _int(d.get("requested_bytes"))
    if not reserved or split is None:
        return None
    blocked = (requested is not None and cached_free is not None and largest is not None
               and largest < requested <= cached_free)
    share = split / reserved
    if not blocked and share < FRAGMENTED_SHARE:
        return None
    return {"blocked": blocked, "split_bytes": split, "split_share": share, "reserved_bytes": reserved,
            "largest_free_block_bytes": largest, "cached_free_bytes": cached_free,
            "requested_bytes": requested, "expandable_segments": bool(d.get("expandable_segments"))}


def advice(r: OomReport) -> list[str]:
    """What to change, from what the record measured: the request, the breakdown at the failure,
    the allocator's state; the phase alone only when nothing was measured."""
    d = r.data
    if r.requested_bytes is not None and r.requested_bytes > ABSURD_REQUEST:
        return ["a shape bug: the request is larger than any device; check the sizes that "
                f"{r.module or 'the failing code'} computes (a wrong dimension or a missing reshape)"]
    if r.kind == "killed":
        if d.get("likely_oom_killer"):
            return ["host memory ran out: load data lazily or memory-map it, use fewer DataLoader "
                    "workers, avoid keeping tensors or losses of every step (use loss.item())"]
        return ["the process was killed from outside; if it was for memory, check the last samples "
                "against the machine's (or the job's cgroup) limit"]
    out: list[str] = []
    frag = fragmentation(d)
    if frag is not None and frag["blocked"]:
        out.append(_fragmentation_tip(frag))
    short = _short_of_memory(d)
    if short:
        out.append(short)
    outside = _int(d.get("outside_pytorch_bytes"))
    total = _int(d.get("nvml_total_bytes")) or _int(d.get("device_total_bytes"))
    if outside and total and outside >= OUTSIDE_SHARE * total:
        others = _int(d.get("other_processes_bytes"))
        who = (f"{human_bytes(others)} of it other processes'" if others
               else "the CUDA context, library workspaces (cuBLAS, cuDNN, NCCL) or other processes")
        out.append(f"{human_bytes(outside)} of the device is outside PyTorch's allocator ({who}): "
                   "free the GPU of other jobs, or budget for it")
    if r.evaluation:
        out.append(evaluation_tip(r))
    bd = demand(r)
    scores = attention_tip(d, (r.breakdown or {}).get("activations", 0)) if r.breakdown_at_failure else None
    if scores:
        out.append(scores)
    if bd:
        tensors = sum(bd.values())
        biggest = max(("activations", "optimizer_state", "parameters", "gradients"), key=lambda k: bd.get(k, 0))
        if tensors and bd.get(biggest, 0) >= 0.3 * tensors:
            asked = r.requested_bytes is not None and r.requested_bytes <= ABSURD_REQUEST
            share = (f"{bd[biggest] / tensors:.0%} of the {human_bytes(tensors)} live at the failure"
                     + (" with the request" if asked else ""))
            out.extend(_BY_CATEGORY[biggest](human_bytes(bd[biggest]), share, r))
    if frag is not None and not frag["blocked"] and not frag["expandable_segments"]:
        out.append(_fragmentation_tip(frag))
    if d.get("site") and not out:
        out.append(f"the failing allocation was made at {d['site']}: shrink what it allocates "
                   "(the batch, the sequence length) or free what is live before it")
    if out:
        return out
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


def _short_of_memory(d: dict[str, Any]) -> str | None:
    """CUDA: the request did not fit even into the driver's free memory plus the whole free cache:
    not fragmentation, too much allocated; name the sites that hold the most, when known."""
    requested, free = _int(d.get("requested_bytes")), _int(d.get("device_free_bytes"))
    cached, allocated = _int(d.get("cached_free_bytes")), _int(d.get("allocated_bytes"))
    if requested is None or free is None or cached is None or requested <= free + cached:
        return None
    text = (f"the request ({human_bytes(requested)}) is more than the device's free "
            f"{human_bytes(free)} and the cache's free {human_bytes(cached)} together: what is "
            f"allocated ({human_bytes(allocated)}) must shrink")
    sites = [e for e in d.get("allocated_by_site") or [] if isinstance(e, dict) and e.get("site")]
    if sites:
        top = ", ".join(f"{e['site']} {human_bytes(_int(e.get('bytes')))}" for e in sites[:2])
        text += f"; the most is held by allocations from {top}"
    return text


def _fragmentation_tip(f: dict[str, Any]) -> str:
    if f["blocked"]:
        head = (f"fragmentation: {human_bytes(f['cached_free_bytes'])} was free in the cache but "
                f"its largest block was {human_bytes(f['largest_free_block_bytes'])}, less than the "
                f"{human_bytes(f['requested_bytes'])} asked for")
    else:
        head = (f"fragmentation: {human_bytes(f['split_bytes'])} ({f['split_share']:.0%} of reserved) "
                "sat in inactive split blocks")
    if f["expandable_segments"]:
        return head + "; expandable_segments is already on: `max_split_size_mb:N` in " \
                      "PYTORCH_CUDA_ALLOC_CONF limits splitting of large blocks"
    return head + "; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the script starts"


def evaluation_tip(r: OomReport) -> str:
    """An evaluation with autograd on: what torch.no_grad() saves (the activations it saved for
    a backward that never comes)."""
    saved = (r.breakdown or {}).get("activations", 0)
    return (f"an evaluation with autograd on (the model is in eval mode, yet its forward saved "
            f"{human_bytes(saved)} of activations for a backward that never comes): run it under "
            "`with torch.no_grad():` or `with torch.inference_mode():`, which saves all of them")


def _activation_tips(amount: str, share: str, r: OomReport) -> list[str]:
    if r.evaluation:  # checkpointing and accumulation are for training: evaluation_tip said it
        return ["mixed precision (bf16 autocast) halves what its matmuls make"]
    where = ""
    live = (r.breakdown or {}).get("activations", 0)
    top = [m for m in r.activations_by_module[:1]
           if m.get("type") is not None and live and (_int(m.get("bytes")) or 0) >= 0.1 * live]
    if top:
        where += f"; module {top[0]['module'] or '(model)'} saved the most"
    if r.phase == "forward" and r.module is not None:
        where += f"; the request came from module {r.module or '(model)'}"
    return [f"activations {amount} ({share}{where}): activation checkpointing on the largest "
            "blocks, or a smaller micro-batch with gradient accumulation",
            "mixed precision (bf16 autocast) halves what matmuls save"]


def _optimizer_tips(amount: str, share: str, r: OomReport) -> list[str]:
    full = full_state(r.data.get("optimizer"))
    whole = ""
    if full is not None and full > (_int((r.data.get("optimizer") or {}).get("state_bytes")) or 0):
        whole = (f"; {r.data['optimizer']['class']} builds {human_bytes(full)} of state in all "
                 "(it was still building it)")
    return [f"optimizer state {amount} ({share}{whole}): a lighter optimizer (SGD with momentum, "
            "Adafactor, 8-bit Adam), or shard / offload it (ZeRO, FSDP)"]


# states per trainable parameter each optimizer builds (torch.optim): Adam's exp_avg and exp_avg_sq
STATES_PER_PARAM = {"Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "SparseAdam": 2,
                    "Adadelta": 2, "Adagrad": 1, "RMSprop": 1}


def full_state(opt: Any) -> int | None:
    """The bytes of state the optimizer in the record builds once every parameter has it
    (``STATES_PER_PARAM`` x its trainable parameters), None when not known."""
    if not isinstance(opt, dict):
        return None
    per = STATES_PER_PARAM.get(str(opt.get("class")))
    trainable = _int(opt.get("trainable_bytes"))
    return per * trainable if per and trainable else None


def _parameter_tips(amount: str, share: str, r: OomReport) -> list[str]:
    return [f"parameters {amount} ({share}): a smaller model, bf16 weights, 4-bit frozen weights "
            "(QLoRA), or sharding (FSDP)"]


def _gradient_tips(amount: str, share: str, r: OomReport) -> list[str]:
    return [f"gradients {amount} ({share}): set_to_none in zero_grad (the default), freeze what "
            "need not train, or shard gradients (ZeRO-2, FSDP)"]


_BY_CATEGORY = {"activations": _activation_tips, "optimizer_state": _optimizer_tips,
                "parameters": _parameter_tips, "gradients": _gradient_tips}


# -- the post-mortem as labelled lines ----------------------------------------------------------

Fact = tuple[str, str]  # (label, text); an empty label continues the previous fact

# keys facts() words itself; anything else the record carries is listed as it is
_WORDED = {
    "step", "phase", "where", "module", "module_type", "module_stack", "exception", "message",
    "requested_bytes", "requested_exact", "device", "live_bytes", "rss", "reserved_bytes",
    "device_free_bytes", "device_total_bytes", "device_limit_bytes", "host_total_bytes",
    "breakdown", "breakdown_step", "breakdown_at_failure", "profiled_breakdown", "activations_by_module",
    "census", "allocated_bytes", "active_bytes", "inactive_split_bytes", "cached_free_bytes",
    "largest_free_block_bytes", "alloc_retries", "ooms", "segments", "expandable_segments", "alloc_conf",
    "nvml_used_bytes", "nvml_total_bytes", "nvml_process_bytes", "outside_pytorch_bytes",
    "outside_this_process_bytes", "other_processes_bytes", "site", "stream", "time_us", "cuda_error",
    "allocated_by_site", "limits", "vms", "training", "optimizer",
    "last_rss", "last_allocated", "last_sample_t", "likely_oom_killer", "signal", "signal_name",
}


def facts(r: OomReport) -> list[Fact]:
    """The post-mortem, fact by fact: what, where, memory, allocator, outside PyTorch,
    breakdown, activations by module, site, anything else recorded, and what to change."""
    d = r.data
    out: list[Fact] = []
    if r.kind == "killed":
        out.append(("what", r.message))
        on = f" on rank {r.rank}" if r.rank is not None else ""
        if r.step is not None:
            out.append(("where", f"during step {r.step}{on} (the step in progress at the last sample)"))
        elif on:
            out.append(("where", on.strip()))
        mem = f"last sample: host RSS {human_bytes(d.get('last_rss'))}"
        if d.get("host_total_bytes"):
            mem += f" of {human_bytes(d['host_total_bytes'])} on this machine"
            if d.get("last_rss") is not None:
                mem += f" ({100 * d['last_rss'] / d['host_total_bytes']:.0f}%)"
        if d.get("last_allocated") is not None:
            mem += f", CUDA allocated {human_bytes(d['last_allocated'])}"
        out.append(("memory", mem))
        if not d.get("likely_oom_killer"):
            out.append(("", "memory was not near the machine's total: probably not the OOM killer"))
        out.extend(_leftovers(d))
        return out + _tips(r)
    out.append(("what", f"out of memory: {r.message}" + (f" ({d['exception']})" if d.get("exception") else "")))
    where = f"step {r.step}" if r.step is not None else "outside any step"
    if r.rank is not None:  # a torchrun job: which of its processes failed
        where = f"rank {r.rank}, {where}"
    where += f", {r.phase}"
    if r.module is not None:
        mtype = f" ({d['module_type']})" if d.get("module_type") else ""
        where += f", in module {r.module or '(the model itself)'}{mtype}"
    out.append(("where", where))
    stack = [n if n else "(model)" for n in (d.get("module_stack") or []) if n is not None]
    if len(stack) > 1:
        out.append(("", f"module path: {' > '.join(stack)}"))
    site = [f"allocation site: {d['site']}"] if d.get("site") else []
    if d.get("stream") is not None:
        site.append(f"stream {d['stream']}")
    if d.get("time_us") is not None:
        site.append(f"at {d['time_us']} µs on the trace's clock")
    if site:
        out.append(("", " · ".join(site)))
    seen = {"backward": "the backward wrapper", "forward_hook": "a forward hook, as it unwound",
            "optimizer": "the optimizer-step guard", "unhandled": "the uncaught-exception hook",
            "cuda_observer": "the CUDA allocator's observer only", "snapshot": "a memory snapshot"}
    if d.get("where"):
        out.append(("", f"seen by {seen.get(d['where'], d['where'])}"
                        + (f", {r.others} more out-of-memory error(s) later in the run" if r.others else "")))
    elif r.others:
        out.append(("", f"{r.others} more out-of-memory error(s) later in the run"))
    if d.get("training") is False:
        out.append(("", "the model was in eval mode (model.eval()) with autograd on"))
    opt = d.get("optimizer")
    if isinstance(opt, dict) and opt.get("class"):
        out.append(("", f"in {opt['class']}.step(): {human_bytes(_int(opt.get('state_bytes')))} of optimizer "
                        f"state built for {human_bytes(_int(opt.get('trainable_bytes')))} of trainable parameters"))
    for i, o in enumerate(r.later[:MAX_LATER]):
        out.append(("later" if i == 0 else "", later_line(o)))
    if len(r.later) > MAX_LATER:
        out.append(("", f"... and {len(r.later) - MAX_LATER} more (report --json: ooms)"))
    out.extend(_memory(r))
    out.extend(_allocator(d))
    out.extend(_breakdown(r))
    out.extend(_leftovers(d))
    return out + _tips(r)


def _memory(r: OomReport) -> list[Fact]:
    d = r.data
    device = d.get("device") or "cpu"
    live_name = "host RSS" if device == "cpu" else "allocated"
    exact = "" if d.get("requested_exact", True) else " (rounded, from the message)"
    lines: list[Fact] = [("memory", f"requested {human_bytes(r.requested_bytes)}{exact}"
                                    f" with {human_bytes(r.live_bytes)} {live_name} on {device}")]
    full = []
    if device != "cpu" and d.get("reserved_bytes") is not None:
        full.append(f"reserved {human_bytes(d['reserved_bytes'])}")
    if d.get("device_free_bytes") is not None:
        free = f"device free {human_bytes(d['device_free_bytes'])}"
        if d.get("device_total_bytes"):
            free += f" of {human_bytes(d['device_total_bytes'])}"
        full.append(free)
    if d.get("device_limit_bytes") is not None:
        full.append(f"this process may use {human_bytes(d['device_limit_bytes'])}")
    limit = r.limit
    if device == "cpu" and d.get("host_total_bytes") and r.live_bytes is not None and (
            limit is None or limit["kind"] == "host_memory"):
        full.append(f"{100 * r.live_bytes / d['host_total_bytes']:.0f}% of the machine's "
                    f"{human_bytes(d['host_total_bytes'])}")
    elif device == "cpu" and d.get("host_total_bytes"):
        full.append(f"the machine has {human_bytes(d['host_total_bytes'])}")
    if d.get("rss") is not None and device != "cpu":
        host = f"host RSS {human_bytes(d['rss'])}"
        if d.get("host_total_bytes"):
            host += f" of {human_bytes(d['host_total_bytes'])}"
        full.append(host)
    if d.get("vms") is not None and (limit is None or limit["kind"] != "RLIMIT_AS"):  # that line says it
        full.append(f"virtual size {human_bytes(d['vms'])}")
    if full:
        lines.append(("", " · ".join(full)))
    if limit is not None and limit["kind"] != "host_memory":  # the machine's share is said above
        lines.append(("limit", limit_line(limit, r.requested_bytes)))
    return lines


_ALLOCATOR_SIZES = (("allocated_bytes", "allocated"), ("reserved_bytes", "reserved"),
                    ("active_bytes", "active"), ("cached_free_bytes", "free in the cache"),
                    ("largest_free_block_bytes", "largest free block"),
                    ("inactive_split_bytes", "inactive split blocks"))


def _allocator(d: dict[str, Any]) -> list[Fact]:
    """CUDA: allocated vs reserved, the free cache and its largest block, split blocks,
    retries, the configuration, and NVML's view (memory outside PyTorch)."""
    lines: list[Fact] = []
    parts = [f"{label} {human_bytes(d[key])}" for key, label in _ALLOCATOR_SIZES if d.get(key) is not None]
    if d.get("segments") is not None:
        parts.append(f"{d['segments']} segment(s)")
    counts = []
    if d.get("alloc_retries") is not None:
        counts.append(f"{d['alloc_retries']} allocation retr{'y' if d['alloc_retries'] == 1 else 'ies'} "
                      "(cache flushes)")
    if d.get("ooms") is not None:
        counts.append(f"{d['ooms']} OOM(s) counted by the allocator")
    if "expandable_segments" in d or d.get("alloc_conf"):
        conf = f"PYTORCH_CUDA_ALLOC_CONF={d['alloc_conf']}" if d.get("alloc_conf") else \
            "PYTORCH_CUDA_ALLOC_CONF unset"
        counts.append(f"expandable_segments {'on' if d.get('expandable_segments') else 'off'} ({conf})")
    if parts:
        lines.append(("allocator", " · ".join(parts)))
    if counts:
        lines.append(("" if parts else "allocator", " · ".join(counts)))
    frag = fragmentation(d)
    if frag is not None:
        lines.append(("", "fragmented: the cache held enough free bytes but no block that large"
                      if frag["blocked"] else
                      f"fragmented: {frag['split_share']:.0%} of reserved in inactive split blocks"))
    nv = []
    if d.get("nvml_used_bytes") is not None:
        used = f"NVML: {human_bytes(d['nvml_used_bytes'])} used"
        if d.get("nvml_total_bytes"):
            used += f" of {human_bytes(d['nvml_total_bytes'])}"
        nv.append(used + " on the device (all processes)")
    if d.get("outside_pytorch_bytes") is not None:
        nv.append(f"{human_bytes(d['outside_pytorch_bytes'])} outside PyTorch's allocator")
    if d.get("nvml_process_bytes") is not None:
        nv.append(f"this process {human_bytes(d['nvml_process_bytes'])}")
    if d.get("outside_this_process_bytes") is not None:
        nv.append(f"of which outside the allocator (CUDA context, cuBLAS/cuDNN workspaces, NCCL) "
                  f"{human_bytes(d['outside_this_process_bytes'])}")
    if d.get("other_processes_bytes") is not None:
        nv.append(f"other processes {human_bytes(d['other_processes_bytes'])}")
    if nv:
        lines.append(("outside", " · ".join(nv)))
    if d.get("cuda_error"):
        lines.append(("", f"allocator state not read: {d['cuda_error']}"))
    return lines


def _breakdown(r: OomReport) -> list[Fact]:
    d = r.data
    lines: list[Fact] = []
    bd = r.breakdown
    if bd:
        text = " · ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in bd.items())
        if r.breakdown_at_failure:
            label = f"at the failure (step {r.breakdown_step})" if r.breakdown_step is not None \
                else "at the failure"
            lines.append(("breakdown", f"{label}: {text}"))
            lines.append(("", f"live tensors on {d.get('device') or 'cpu'}: {human_bytes(sum(bd.values()))}"
                          " (other: tensors outside these categories)"))
        else:
            at = f"profiled step {r.breakdown_step}" if r.breakdown_step is not None else "an earlier step"
            lines.append(("breakdown", f"at {at}, before the failure (not measured at it): {text}"))
    elif d.get("where") == "snapshot":
        lines.append(("breakdown", "by category: not in a memory snapshot (it records allocations by site)"))
    else:
        lines.append(("breakdown", "not measured (no census at the failure and no profiled step)"))
    census = d.get("census")
    if isinstance(census, dict) and census:
        if census.get("skipped"):
            lines.append(("", f"census at the failure skipped: {census['skipped']}"))
        else:
            c = f"census: {census.get('tensors')} tensors, {census.get('graph_nodes')} graph nodes in " \
                f"{1000 * float(census.get('seconds') or 0):.0f} ms"
            if census.get("truncated"):
                c += " (cut short at its time or node cap: a lower bound)"
            lines.append(("", c))
    prof = d.get("profiled_breakdown")
    if r.breakdown_at_failure and isinstance(prof, dict):
        text = " · ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in prof.items()
                          if k != "step" and v is not None)
        lines.append(("", f"for comparison, profiled step {prof.get('step')}: {text}"))
    mods = r.activations_by_module
    if mods:
        lines.append(("by module", "activations live at the failure, by the module that saved them"))
        width = max(len(m.get("module") or "(model)") for m in mods)
        for m in mods:
            name = m.get("module") or "(model)"
            kind = f" ({m['type']})" if m.get("type") else ""
            lines.append(("", f"  {name.ljust(width)}  {human_bytes(_int(m.get('bytes'))):>10}{kind}"))
    sites = d.get("allocated_by_site")
    if isinstance(sites, list) and sites:
        lines.append(("by site", "allocated in the snapshot, by the first frame outside torch"))
        for e in sites:
            if isinstance(e, dict):
                site = e.get("site") or "(no frames recorded)"
                lines.append(("", f"  {human_bytes(_int(e.get('bytes'))):>11}  {site}"))
    if r.breakdown_at_failure and not mods and "activations_by_module" in d:
        lines.append(("by module", "not known: the failing step's module calls were not logged "
                                   "(hooks unarmed: low memory, not step 0, not profiled)"))
    return lines


def _leftovers(d: dict[str, Any]) -> list[Fact]:
    """Every other fact the record carries, as it is."""
    rest = {k: v for k, v in d.items() if k not in _WORDED and v is not None}
    return [("also", f"{k}: {json.dumps(v) if isinstance(v, (dict, list)) else v}") for k, v in sorted(rest.items())]


def _tips(r: OomReport) -> list[Fact]:
    tips = advice(r)
    return [("change" if i == 0 else "", t) for i, t in enumerate(tips)]


def render(items: list[Fact], width: int = 10) -> str:
    """Labelled lines, the label in a column of ``width``."""
    # each fact is one line: a name from the run file in it is shown escaped (memscope.display)
    return "\n".join(f"{label.ljust(width)}{shown_text(text)}" for label, text in items)


def _rank_of(reader: RunReader, proc: int | None) -> int | None:
    if proc is None:
        return None
    return _int(reader.scalar("SELECT rank FROM processes WHERE id = ?", (proc,)))


def _int(v: Any) -> int | None:
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError, OverflowError):
        return None

"""Planning a training run to fit a GPU: the budget, the techniques, their costs, the ranking.

Pure functions (no torch, no processes). ``memscope fit`` (memscope.runners.fit) fills the
plans with peaks measured by fake runs; ``report`` suggestions (memscope.analysis.suggestions)
with peaks composed from a recorded run's estimated savings. Both rank them here.

**The budget.** A GPU of ``budget`` bytes does not hold ``budget`` bytes of tensors:

* the CUDA context (driver, kernels, cuBLAS handles) lives outside torch's allocator:
  ``CUDA_CONTEXT`` (512 MiB; 300 MiB to 1 GiB by GPU and CUDA version);
* the caching allocator rounds every allocation up to a 512-byte block: counted exactly (the
  fake run's peak is the sum of the rounded blocks, what ``max_memory_allocated`` reports);
* it reserves more than it hands out (segments split by sizes that do not fit the holes):
  ``FRAGMENTATION`` of the budget (5%) is kept free for that.

So a plan *fits* when its allocator peak is at most
``usable = budget - context - fragmentation * budget``.

**Costs.** Every technique buys memory with something; the ranking orders plans by a score,
the sum of their techniques' (lower is cheaper):

* ``mixed_precision`` (bf16 autocast): 0.1. No extra work (on GPUs with tensor cores it is
  usually faster); bf16 numerics.
* ``gradient_accumulation`` over k micro-batches: 0.1 * log2(k). The same work and the same
  effective batch, in smaller kernels that use the GPU less well.
* ``sharding`` (ZeRO stage s over N ranks): 0.05 (stage 1), 0.1 (stage 2) (the communication of
  DDP: a reduce-scatter and an all-gather instead of an all-reduce), 0.4 (stage 3 / FSDP: 1.5x
  DDP's communication, parameters gathered in forward and again in backward).
* ``activation_checkpointing``: the extra compute, as a fraction of the step's FLOPs (measured:
  the fake run counts the FLOPs of the plan's step, recomputation included), at least 0.05.
* ``lighter_optimizer`` (SGD with momentum instead of Adam): 1.0. Nothing extra to compute, but
  a different optimizer: learning rates need retuning and convergence may differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from memscope.units import human_bytes

SCHEMA = "memscope.fit/1"
CUDA_CONTEXT = 512 << 20
FRAGMENTATION = 0.05
MAX_BATCH = 1 << 20  # the batch search stops here (a batch argument that changes nothing)
# names a batch-size option goes by (argparse dests), most specific first
BATCH_NAMES = ("micro_batch_size", "micro_batch", "per_device_train_batch_size", "train_batch_size",
               "batch_size", "batch", "bs", "mbs", "bsz")
COST = {"mixed_precision": 0.1, "lighter_optimizer": 1.0}
SHARDING_COST = {1: 0.05, 2: 0.1, 3: 0.4}
SHARDING_NAME = {1: "ZeRO-1 (optimizer states)", 2: "ZeRO-2 (+ gradients)",
                 3: "ZeRO-3 / FSDP (+ parameters)"}


@dataclass(frozen=True)
class Allowance:
    cuda_context: int = CUDA_CONTEXT
    fragmentation: float = FRAGMENTATION

    def usable(self, budget: int) -> int:
        """Bytes of tensors (allocator peak) a GPU of ``budget`` bytes holds."""
        return int(budget - self.cuda_context - self.fragmentation * budget)

    def describe(self, budget: int) -> str:
        return (f"{human_bytes(self.usable(budget))} for tensors = {human_bytes(budget)} "
                f"- {human_bytes(self.cuda_context)} CUDA context - {self.fragmentation:.0%} "
                f"({human_bytes(self.fragmentation * budget)}) for the caching allocator's "
                "fragmentation; peaks are allocator peaks (each allocation rounded up to 512 B)")


@dataclass
class Plan:
    techniques: list[dict[str, Any]]  # each {"technique": id, ...details}
    peak_bytes: int
    fits: bool
    cost: str  # what it costs, in words
    score: float  # the ranking key: lower is cheaper
    measured: bool = True  # by a fake run of exactly this plan (False: composed or analytic)
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"techniques": self.techniques, "peak_bytes": int(self.peak_bytes),
                "fits": bool(self.fits), "cost": self.cost}

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(t["technique"] for t in self.techniques)


# -- techniques and their costs -------------------------------------------------------------------


def mixed_precision() -> dict[str, Any]:
    return {"technique": "mixed_precision", "dtype": "bfloat16",
            "how": "the model's forward under torch.autocast(device, dtype=torch.bfloat16)"}


def checkpointing(blocks: Sequence[str], of: int, container: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"technique": "activation_checkpointing", "blocks": list(blocks), "of": of}
    if container:
        out["container"] = container
    return out


def lighter_optimizer(replaces: Sequence[str]) -> dict[str, Any]:
    return {"technique": "lighter_optimizer", "optimizer": "SGD(momentum=0.9)",
            "replaces": "/".join(replaces) or "Adam"}


def accumulation(steps: int, micro_batch: int, effective: int) -> dict[str, Any]:
    return {"technique": "gradient_accumulation", "steps": steps, "micro_batch": micro_batch,
            "effective_batch": effective}


def sharding(stage: int, world_size: int) -> dict[str, Any]:
    return {"technique": "sharding", "stage": stage, "world_size": world_size,
            "name": SHARDING_NAME[stage]}


def score(techniques: Iterable[dict[str, Any]], extra_flops: float = 0.0) -> float:
    total = 0.0
    for t in techniques:
        kind = t["technique"]
        if kind == "gradient_accumulation":
            total += 0.1 * math.log2(max(2, int(t["steps"])))
        elif kind == "sharding":
            total += SHARDING_COST[int(t["stage"])]
        elif kind in ("activation_checkpointing", "selective_checkpointing"):
            total += max(0.05, extra_flops)
        else:
            total += COST.get(kind, 0.5)
    return round(total, 4)


def describe_cost(techniques: Sequence[dict[str, Any]], extra_flops: float | None,
                  communication: int | None = None) -> str:
    """The cost in a few words: extra compute, communication, what changes for the training."""
    if not techniques:
        return "none"
    words = []
    for t in techniques:
        kind = t["technique"]
        if kind == "mixed_precision":
            words.append("bf16 numerics")
        elif kind in ("activation_checkpointing", "selective_checkpointing"):
            flops = f"+{extra_flops:.0%} FLOPs" if extra_flops is not None else "extra FLOPs"
            words.append(f"{flops} (recompute)")
        elif kind == "gradient_accumulation":
            words.append(f"{t['steps']} micro-batches per step")
        elif kind == "sharding":
            s = int(t["stage"])
            words.append(("1.5x DDP communication" if s == 3 else "DDP communication")
                         + (f" ({human_bytes(communication)}/step/rank)" if communication else ""))
        elif kind == "lighter_optimizer":
            words.append("retune LR (SGD, not Adam)")
    return "; ".join(words)


def shard(peak: int, at_peak: dict[str, int], stage: int, world: int,
          largest_block_params: int) -> int:
    """The peak of one rank with ZeRO stage ``stage`` over ``world`` ranks, from what was live
    at the unsharded peak: stage 1 keeps 1/world of the optimizer state, stage 2 of the
    gradients too, stage 3 of the parameters too, plus the full parameters of the unit being
    gathered and the next one prefetched (twice the largest block's; the whole model when it is
    one unit)."""
    keep = 1.0 / world
    out = peak - at_peak.get("optimizer_state", 0) * (1 - keep)
    if stage >= 2:
        out -= at_peak.get("gradients", 0) * (1 - keep)
    if stage >= 3:
        params = at_peak.get("parameters", 0)
        gathered = min(params, 2 * largest_block_params) if largest_block_params else params
        out -= params * (1 - keep)
        out += gathered * (1 - keep)
    return int(out)


def communication(stage: int, world: int, gradient_bytes: int) -> int:
    """Bytes each rank sends per step: a ring all-reduce of the gradients moves 2(N-1)/N of
    them (DDP, ZeRO-1, ZeRO-2: a reduce-scatter and an all-gather); ZeRO-3 gathers the
    parameters once more (3(N-1)/N)."""
    factor = 3 if stage >= 3 else 2
    return int(factor * (world - 1) / world * gradient_bytes)


# -- the batch ------------------------------------------------------------------------------------


@dataclass
class BatchArgument:
    kind: str  # "option" (an argparse option of the script) or "dataloader"
    name: str  # the option string ("--batch"), or "DataLoader(batch_size=...)"
    value: int  # the current micro-batch

    def script_args(self, args: Sequence[str], batch: int) -> list[str]:
        """The script's arguments with the batch set to ``batch`` (an option)."""
        if self.kind != "option":
            return list(args)
        out = list(args)
        for i, a in enumerate(out):
            if a == self.name and i + 1 < len(out):
                out[i + 1] = str(batch)
                return out
            if a.startswith(self.name + "="):
                out[i] = f"{self.name}={batch}"
                return out
        return [*out, self.name, str(batch)]


def find_batch_argument(parsers: Sequence[dict[str, Any]], loader_batches: Sequence[int],
                        named: str | None = None) -> BatchArgument | None:
    """The script's micro-batch knob, from what a fake run saw: an argparse option whose name
    says batch (or the one ``named``), else the batch size of the first DataLoader."""
    options = [o for p in parsers for o in p.get("options", [])]

    def as_arg(o: dict[str, Any]) -> BatchArgument | None:
        value = o.get("value")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return None
        longs = [s for s in o["options"] if s.startswith("--")]
        return BatchArgument("option", (longs or o["options"])[0], value)

    if named is not None:
        if named.lower().startswith("dataloader"):
            return BatchArgument("dataloader", "DataLoader(batch_size=...)", loader_batches[0]) \
                if loader_batches else None
        for o in options:
            if named in o["options"] or named == o["dest"]:
                return as_arg(o)
        return None
    for want in BATCH_NAMES:
        for o in options:
            if o["dest"] == want:
                found = as_arg(o)
                if found is not None:
                    return found
    if loader_batches:
        return BatchArgument("dataloader", "DataLoader(batch_size=...)", loader_batches[0])
    return None


def next_batch(points: dict[int, int], usable: int) -> int | None:
    """The next micro-batch to try in the search for the largest whose peak is at most
    ``usable``, from the peaks measured so far (``points``: batch -> peak); None when the answer
    is known: the largest fitting batch with its successor measured not to fit (or batch 1 not
    fitting). Guesses are linear from the nearest two measured batches (activations grow
    linearly with the batch): on a linear model the bracket closes in two runs."""
    lo = largest_fitting(points, usable)  # 0: nothing measured fits
    above = [b for b, p in points.items() if p > usable and b > lo]
    hi = min(above) if above else None
    if hi is not None and hi == lo + 1:
        return None
    if hi is None:
        if lo >= MAX_BATCH:
            return None
        lower = [b for b in points if b < lo]
        guess = _secant(points, lo, max(lower) if lower else None, usable)
        return max(lo + 1, min(MAX_BATCH, 2 * lo if guess is None else guess))
    if lo == 0:
        higher = [b for b in points if b > hi]
        guess = _secant(points, hi, min(higher) if higher else None, usable)
    else:
        guess = _secant(points, lo, hi, usable)
    # a wide bracket shrinks by a quarter at least, so a curved peak (attention over a
    # growing batch, say) does not leave the secant creeping along one end
    margin = (hi - lo) // 4 if hi - lo > 8 else 1
    return max(lo + margin, min(hi - margin, (lo + hi) // 2 if guess is None else guess))


def _secant(points: dict[int, int], a: int, b: int | None, usable: int) -> int | None:
    """Where the line through the peaks at batches ``a`` and ``b`` reaches ``usable``."""
    if b is None or a == b:
        return None
    slope = (points[a] - points[b]) / (a - b)
    if slope <= 0:
        return None
    return int(math.floor(a + (usable - points[a]) / slope))


def largest_fitting(points: dict[int, int], usable: int) -> int:
    fit = [b for b, p in points.items() if p <= usable]
    return max(fit) if fit else 0


def divisors_for_accumulation(batch: int) -> list[int]:
    """Accumulation step counts k that divide the batch evenly (k >= 2), smallest first."""
    return [k for k in range(2, batch + 1) if batch % k == 0]


# -- the ranking ---------------------------------------------------------------------------------


def rank(plans: Iterable[Plan]) -> list[Plan]:
    """Cheapest first; among plans of one cost, the lower peak first. A plan that costs at
    least as much as another and saves no more memory is left out (it is never the better
    choice), except the script as it is."""
    ordered = sorted(plans, key=lambda p: (p.score, p.peak_bytes, len(p.techniques)))
    kept: list[Plan] = []
    seen: set[tuple[str, ...]] = set()
    for p in ordered:
        key = tuple(sorted(_key(t) for t in p.techniques))
        if key in seen:
            continue
        seen.add(key)
        if p.techniques and any(k.peak_bytes <= p.peak_bytes and k.score <= p.score for k in kept):
            continue
        kept.append(p)
    return kept


def _key(t: dict[str, Any]) -> str:
    return "|".join(f"{k}={t[k]}" for k in sorted(t) if k not in ("how",))


def document(budget: int, max_micro_batch: int | None, batch_argument: str | None,
             plans: Sequence[Plan], allowance: Allowance | None = None) -> dict[str, Any]:
    """The ``memscope.fit/1`` JSON document. ``budget`` is the GPU's size (``--gpu``): the first
    documents' ``budget_bytes``, kept as it was (an additive contract); what is left of it for
    tensors, the budget the text's ``budget`` line explains, is ``tensor_budget_bytes``."""
    allowance = allowance or Allowance()
    usable = allowance.usable(budget)
    return {"schema": SCHEMA, "budget_bytes": int(budget), "max_micro_batch": max_micro_batch,
            "batch_argument": batch_argument, "plans": [p.as_json() for p in plans],
            "gpu_bytes": int(budget), "tensor_budget_bytes": usable,
            "cuda_context_bytes": int(allowance.cuda_context),
            # what the fragmentation reserve takes, so that the three parts add up exactly
            "fragmentation_bytes": int(budget) - int(allowance.cuda_context) - usable}


# -- from a recorded run (report suggestions) --------------------------------------------------------


def plan_from_savings(peak: int, usable: int, savings: dict[str, int], activations: int,
                      world_size: int = 1) -> list[Plan]:
    """Plans from a recorded run's estimated savings (each technique's alone, from the
    suggestion rules): activation savings (mixed precision, checkpointing, accumulation) compose
    on what is left of the activations (a technique saves its share of what the others left),
    state savings (a lighter optimizer, sharding) add. Ranked as ``fit`` ranks; composed, not
    measured (``memscope fit`` measures them with fake runs)."""
    acts = max(1, activations)
    act_ids = [t for t in ("mixed_precision", "activation_checkpointing", "gradient_accumulation")
               if savings.get(t, 0) > 0]
    state_ids = [t for t in ("lighter_optimizer", "sharding") if savings.get(t, 0) > 0]
    plans: list[Plan] = []
    for mask in range(1, 1 << (len(act_ids) + len(state_ids))):
        chosen = [t for i, t in enumerate(act_ids + state_ids) if mask >> i & 1]
        left = 1.0
        for t in chosen:
            if t in act_ids:
                left *= max(0.0, 1 - savings[t] / acts)
        saved = int(activations * (1 - left)) + sum(savings[t] for t in chosen if t in state_ids)
        techniques = []
        for t in chosen:
            if t == "mixed_precision":
                techniques.append(mixed_precision())
            elif t == "activation_checkpointing":
                techniques.append({"technique": t, "blocks": ["(every block)"], "of": 0})
            elif t == "gradient_accumulation":
                techniques.append({"technique": t, "steps": 2, "micro_batch": 0, "effective_batch": 0})
            elif t == "lighter_optimizer":
                techniques.append(lighter_optimizer([]))
            else:
                techniques.append(sharding(3, max(2, world_size)))
        predicted = max(0, peak - saved)
        plans.append(Plan(techniques, predicted, predicted <= usable,
                          _short_cost(chosen), score(techniques, 0.33), measured=False))
    return rank(plans)


def _short_cost(ids: Sequence[str]) -> str:
    words = {"mixed_precision": "bf16 numerics", "activation_checkpointing": "about one more forward",
             "gradient_accumulation": "2 micro-batches per step",
             "lighter_optimizer": "SGD instead of Adam (retune)",
             "sharding": "ZeRO-3 / FSDP communication"}
    return "; ".join(words[t] for t in ids)

"""The selective-checkpointing plan: from one block's op-level profile (the ``sac_profile``
event, memscope.agent.whatif.sac_profile), which aten ops to keep and which to recompute, and the
memory / recompute curve over those choices. Pure (no torch).

The policy is per op kind (an overload packet, "aten.addmm"), the same for every block of the
kind, as ``create_selective_checkpoint_contexts`` applies it. What a plan costs, per block:

* kept bytes: under the checkpoint's caching mode every output of a MUST_SAVE op is kept until
  backward, needed or not; the union of their storages created inside the block (a view keeps
  its base). Without checkpointing the block keeps what autograd saved (``saved``).
* recompute FLOPs: non-reentrant checkpointing reruns the forward in backward, and stops early
  once the last tensor backward needs is rebuilt: the ops before the last pack of the forward
  (``last_pack``) that are not kept. FLOPs are torch.utils.flop_counter's (matmuls, attention,
  convolutions; pointwise ops count zero), so a plan that keeps every op with FLOPs recomputes
  zero FLOPs.

Only ops with FLOPs are worth keeping (keeping a zero-FLOP op costs memory and saves nothing
counted), so the choices are the subsets of the op kinds with FLOPs (a handful in a
transformer block: every subset is tried, an exact knapsack), plus no checkpointing.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

MAX_KINDS = 12  # 2**12 subsets at most; more FLOP-bearing op kinds than this: the largest ones


@dataclass(frozen=True)
class Op:
    name: str
    flops: int
    out: tuple[int, ...]


@dataclass(frozen=True)
class BlockProfile:
    container: str
    block_type: str
    blocks: int
    ops: tuple[Op, ...]
    sizes: tuple[int, ...]
    made: tuple[bool, ...]
    saved: frozenset[int]
    last_pack: int

    @property
    def forward_flops(self) -> int:
        return sum(o.flops for o in self.ops)

    @property
    def saved_bytes(self) -> int:
        """Bytes autograd keeps for this block without checkpointing (created inside it)."""
        return sum(self.sizes[n] for n in self.saved if self.made[n])

    def kept_bytes(self, save: frozenset[str]) -> int:
        kept = {n for o in self.ops if o.name in save for n in o.out if self.made[n]}
        return sum(self.sizes[n] for n in kept)

    def recompute_flops(self, save: frozenset[str]) -> int:
        return sum(o.flops for o in self.ops[:self.last_pack] if o.name not in save)

    def flop_kinds(self) -> list[str]:
        per: dict[str, int] = {}
        for o in self.ops:
            if o.flops:
                per[o.name] = per.get(o.name, 0) + o.flops
        return sorted(per, key=lambda k: -per[k])[:MAX_KINDS]


def parse_profile(data: dict[str, Any]) -> BlockProfile:
    """The ``sac_profile`` event's data; ValueError when it is not one."""
    try:
        sizes = tuple(int(s["bytes"]) for s in data["storages"])
        made = tuple(bool(s["made"]) for s in data["storages"])
        ops = tuple(Op(str(o["op"]), int(o["flops"]), tuple(int(n) for n in o["out"])) for o in data["ops"])
        saved = frozenset(int(n) for n in data["saved"])
        if any(not 0 <= n < len(sizes) for o in ops for n in o.out) or any(not 0 <= n < len(sizes) for n in saved):
            raise ValueError("a storage number out of range")
        return BlockProfile(str(data["container"]), str(data["block_type"]), int(data["blocks"]), ops,
                            sizes, made, saved, int(data["last_pack"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a sac_profile: {exc}") from None


@dataclass(frozen=True)
class Point:
    """One plan on the curve. ``save`` None: the block is not checkpointed."""

    label: str
    save: tuple[str, ...] | None
    blocks: int  # blocks checkpointed (the first ``blocks`` of the container)
    kept_bytes: int  # per checkpointed block
    activation_bytes: int  # all blocks together, what the plan keeps through the forward
    recompute_flops: int  # per step, all blocks
    recompute_flops_pct: float  # of the blocks' forward FLOPs


def point(p: BlockProfile, save: frozenset[str] | None, blocks: int | None = None, label: str = "") -> Point:
    n = p.blocks if blocks is None else blocks
    if save is None:
        return Point(label or "no checkpointing", None, 0, p.saved_bytes, p.saved_bytes * p.blocks, 0, 0.0)
    kept = p.kept_bytes(save)
    flops = p.recompute_flops(save) * n
    total = p.forward_flops * p.blocks
    return Point(label or (f"keep {', '.join(sorted(save))}" if save else "whole-block"), tuple(sorted(save)), n,
                 kept, kept * n + p.saved_bytes * (p.blocks - n), flops, 100.0 * flops / total if total else 0.0)


def curve(p: BlockProfile) -> list[Point]:
    """No checkpointing, whole-block checkpointing of the first j blocks for every j, and every
    selective plan over the op kinds with FLOPs on all blocks: the Pareto front of (kept bytes,
    recompute FLOPs), most memory first, with no checkpointing and whole-block checkpointing of
    every block always on it."""
    pts = [point(p, None)]
    pts += [point(p, frozenset(), j, f"whole-block, first {j}" if j < p.blocks else "whole-block")
            for j in range(1, p.blocks + 1)]
    kinds = p.flop_kinds()
    for r in range(1, len(kinds) + 1):
        pts += [point(p, frozenset(c)) for c in itertools.combinations(kinds, r)]
    # both ends stay on it as references, even where a selective plan dominates them
    front = [a for a in pts if a.save is None or (a.save == () and a.blocks == p.blocks)
             or not any(_dominates(b, a) for b in pts)]
    seen: set[tuple[int, int]] = set()
    out = []
    for a in sorted(front, key=lambda a: (-a.activation_bytes, a.recompute_flops)):
        if (a.activation_bytes, a.recompute_flops) not in seen:
            seen.add((a.activation_bytes, a.recompute_flops))
            out.append(a)
    return out


def _dominates(b: Point, a: Point) -> bool:
    return (b.activation_bytes <= a.activation_bytes and b.recompute_flops <= a.recompute_flops
            and (b.activation_bytes, b.recompute_flops) != (a.activation_bytes, a.recompute_flops))


def best_under(p: BlockProfile, budget_bytes: int) -> Point | None:
    """The plan on the curve with the least recompute whose activations fit ``budget_bytes``."""
    fits = [a for a in curve(p) if a.activation_bytes <= budget_bytes]
    return min(fits, key=lambda a: (a.recompute_flops, a.activation_bytes)) if fits else None


def selective_default(p: BlockProfile) -> Point:
    """Keep every op kind with FLOPs: recompute only what counts no FLOPs."""
    return point(p, frozenset(p.flop_kinds()))


def suggested(p: BlockProfile) -> Point:
    """The plan ``report`` suggests and ``whatif`` tries: of the selective plans on every block
    that recompute at most half of whole-block checkpointing's FLOPs, the one that keeps the
    least (the matmul-heavy ops kept, the memory-heavy cheap ones recomputed)."""
    whole = point(p, frozenset())
    fits = [pt for pt in curve(p) if pt.save and pt.blocks == p.blocks
            and pt.recompute_flops <= whole.recompute_flops / 2]
    return min(fits, key=lambda pt: (pt.activation_bytes, pt.recompute_flops)) if fits else selective_default(p)


def predicted_peak(baseline_peak: int, window_peak: int, p: BlockProfile, plan: Point) -> int:
    """The step's peak under ``plan``, from two figures of the baseline run: its peak, and the
    highest live bytes during the last block's backward (``window_peak``, the ``sac_live``
    event). Each checkpointed block keeps ``kept_bytes`` instead of what autograd saved, so the
    baseline's peak drops by that much per block; and the first recomputed block (the last
    checkpointed one) rebuilds its saved tensors during its backward, when the blocks after it
    have freed theirs: the plan's peak is the higher of the two."""
    if plan.save is None or plan.blocks == 0:
        return baseline_peak
    j, n, drop = plan.blocks, p.blocks, p.saved_bytes - plan.kept_bytes
    forward = baseline_peak - j * drop
    recompute = window_peak - (n - j) * p.saved_bytes - (j - 1) * drop
    return max(forward, recompute)


def from_events(profile_events: list[dict[str, Any]], live_events: list[dict[str, Any]]) \
        -> tuple[BlockProfile, int | None] | None:
    """The block profile and the baseline's window peak (None: not measured) from a run's
    ``sac_profile`` and ``sac_live`` events; None without a profile."""
    datas = [e["data"] for e in profile_events if isinstance(e.get("data"), dict)]
    if not datas:
        return None
    windows = [int(e["data"]["window_peak"]) for e in live_events
               if isinstance(e.get("data"), dict) and isinstance(e["data"].get("window_peak"), int)]
    return parse_profile(datas[0]), (windows[0] if windows else None)


def point_json(pt: Point, predicted: int | None = None) -> dict[str, Any]:
    return {"label": pt.label, "save": list(pt.save) if pt.save is not None else None, "blocks": pt.blocks,
            "kept_bytes_per_block": pt.kept_bytes, "activation_bytes": pt.activation_bytes,
            "recompute_flops": pt.recompute_flops, "recompute_flops_pct": round(pt.recompute_flops_pct, 2),
            "predicted_peak_bytes": predicted}


def technique_json(p: BlockProfile, pt: Point) -> dict[str, Any]:
    """The technique object of ``memscope.fit/1`` for a selective plan."""
    return {"technique": "selective_checkpointing",
            "blocks": [f"{p.container}.{i}" if p.container else str(i) for i in range(pt.blocks)],
            "save": list(pt.save or ()), "recompute_flops_pct": round(pt.recompute_flops_pct, 2)}

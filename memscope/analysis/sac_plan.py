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
from typing import Any, Sequence

from memscope.analysis.checkpoint_peak import Backward as Backward, Region, peak_after

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
    # storage number -> ops run when it was freed during the forward (None: outlived it); None
    # for a profile recorded before this was measured
    died: tuple[int | None, ...] | None = None
    # submodule calls inside the block: (first op, ops run at its return, its output storages)
    calls: tuple[tuple[int, int, frozenset[int]], ...] = ()

    @property
    def forward_flops(self) -> int:
        return sum(o.flops for o in self.ops)

    @property
    def saved_bytes(self) -> int:
        """Bytes autograd keeps for this block without checkpointing (created inside it)."""
        return sum(self.sizes[n] for n in self.saved if self.made[n])

    @property
    def param_bytes(self) -> int:
        """Bytes of what its ops read that it did not make, but its first argument (numbered
        first: its input): its parameters and buffers, whose gradients its backward makes."""
        return sum(size for n, (size, mine) in enumerate(zip(self.sizes, self.made)) if n and not mine)

    def kept_bytes(self, save: frozenset[str]) -> int:
        kept = {n for o in self.ops if o.name in save for n in o.out if self.made[n]}
        return sum(self.sizes[n] for n in kept)

    def carried_bytes(self, save: frozenset[str]) -> int:
        """What a checkpointed block followed by another block of the container keeps beyond
        ``kept_bytes``: its output (the last op's storage), where the block saved it itself (it
        ends in an op that saves its output, a ReLU: ``saved_bytes`` counts it); the next block
        takes it as its input, which its checkpoint keeps (or its first op saves). A block that
        ends in a residual add saved no output: 0. The container's last block carries nothing
        (what follows it is not checkpointed and saved it, if at all, outside the blocks)."""
        if not self.ops:
            return 0
        kept = {n for o in self.ops if o.name in save for n in o.out}
        return sum(self.sizes[n] for n in set(self.ops[-1].out)
                   if self.made[n] and n in self.saved and n not in kept)

    def recompute_flops(self, save: frozenset[str]) -> int:
        return sum(o.flops for o in self.ops[:self.last_pack] if o.name not in save)

    def rerun_bytes(self, save: frozenset[str]) -> int | None:
        """The most bytes the rerun forward of a checkpointed block adds at once to what was
        live when it began (None: not measured). The rerun replays the forward up to the last
        pack: what the recomputed ops create lives as long as it did in the forward (a Python
        local until the block returns, a saved tensor until backward), and a kept output is
        let go when the forward let it go (the cache hands it over once)."""
        if self.died is None:
            return None
        delta = [0] * (len(self.ops) + 1)
        for n, i in self._born().items():
            d = self.died[n]
            if not self.made[n] or i >= self.last_pack:
                continue
            if self.ops[i].name not in save:  # recomputed: alive from i until it died
                delta[i] += self.sizes[n]
                if d is not None:
                    delta[min(d, len(self.ops))] -= self.sizes[n]
            elif d is not None:  # kept: already live, freed where the forward freed it
                delta[min(d, len(self.ops))] -= self.sizes[n]
        best = live = 0
        for i in range(self.last_pack):
            live += delta[i]
            best = max(best, live)
        return best

    def checkpointed_forward_bytes(self, save: frozenset[str]) -> int | None:
        """The most bytes the block's own tensors take at once during its forward under
        checkpointing (None: not measured): a kept output stays (the cache holds it for
        backward), the rest lives as it did in the profiled forward. What autograd saved there
        outlived the forward; under checkpointing it dies when the block's Python code lets it
        go, which the profile cannot see (autograd held it): it is taken to die when the
        innermost submodule call that made it and did not return it returns (its locals do),
        else to live until the block returns (a local of the block's own forward may)."""
        if self.died is None:
            return None
        end = len(self.ops)
        delta = [0] * (end + 1)
        for n, i in self._born().items():
            if not self.made[n]:
                continue
            d = None if self.ops[i].name in save else self.died[n]
            if d is None and n in self.saved and self.ops[i].name not in save:
                d = min((b for a, b, outs in self.calls if a <= i < b and n not in outs), default=None)
            delta[i] += self.sizes[n]
            if d is not None:
                delta[min(d, end)] -= self.sizes[n]
        best = live = 0
        for i in range(end):
            live += delta[i]
            best = max(best, live)
        return best

    def _born(self) -> dict[int, int]:
        born: dict[int, int] = {}
        for i, o in enumerate(self.ops):
            for n in o.out:
                born.setdefault(n, i)
        return born

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
        deaths = [s.get("died") for s in data["storages"]]
        died = (None if any("died" not in s for s in data["storages"])
                else tuple(None if d is None else int(d) for d in deaths))
        if any(not 0 <= n < len(sizes) for o in ops for n in o.out) or any(not 0 <= n < len(sizes) for n in saved):
            raise ValueError("a storage number out of range")
        calls = tuple((int(a), int(b), frozenset(int(n) for n in c)) for a, b, c in data.get("calls", ()))
        return BlockProfile(str(data["container"]), str(data["block_type"]), int(data["blocks"]), ops,
                            sizes, made, saved, int(data["last_pack"]), died, calls)
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
    carried = p.carried_bytes(save) * min(n, p.blocks - 1)
    return Point(label or (f"keep {', '.join(sorted(save))}" if save else "whole-block"), tuple(sorted(save)), n,
                 kept, kept * n + carried + p.saved_bytes * (p.blocks - n), flops,
                 100.0 * flops / total if total else 0.0)


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


def parse_backward(data: dict[str, Any], p: BlockProfile) -> Backward:
    """The ``sac_live`` event's data; ValueError when it is not one. An event of the last block
    only (recorded before every block was measured) stands for the others with their saved
    bytes taken off, as they are freed by then."""
    try:
        if isinstance(data.get("blocks"), list):
            blocks = tuple((int(a), int(b)) for a, b in data["blocks"])
            if len(blocks) != p.blocks:
                raise ValueError("one window per block expected")
            starts = tuple(int(a) for a in data.get("forward_starts", ()))
            if starts and len(starts) != p.blocks:
                raise ValueError("one forward start per block expected")
            return Backward(int(data["forward_peak"]), blocks, starts)
        live, window = int(data["live_bytes"]), int(data["window_peak"])
        s = p.saved_bytes
        return Backward(None, tuple((live - (p.blocks - 1 - k) * s, window - (p.blocks - 1 - k) * s)
                                    for k in range(p.blocks)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a sac_live event: {exc}") from None


def regions(p: BlockProfile, plan: Point, held: Sequence[int] = (), outputs: Sequence[int] = ()) \
        -> list[Region]:
    """The container's blocks as regions of the checkpointing peak model
    (memscope.analysis.checkpoint_peak) under ``plan``: the first ``plan.blocks`` checkpointed,
    each keeping ``kept_bytes`` instead of ``saved_bytes``, and its output where the next block
    takes it as its input (``carried_bytes``); its rerun as measured in the forward
    (``rerun_bytes``; without the profile's deaths, what it drops back and its largest tensor);
    its backward's transients: the gradient of its largest tensor. ``held`` and ``outputs`` (per
    block, from the layer rows): each block's input where the block before did not save it, its
    output."""
    save = frozenset(plan.save or ())
    checkpointed = plan.save is not None
    carried = p.carried_bytes(save) if checkpointed else 0
    largest = max([size for size, mine in zip(p.sizes, p.made) if mine], default=0)
    rerun = p.rerun_bytes(save)
    if rerun is None:
        rerun = max(0, p.saved_bytes - plan.kept_bytes) + largest
    inside = p.checkpointed_forward_bytes(save)
    return [Region(f"{p.container}.{k}" if p.container else str(k), p.saved_bytes, plan.kept_bytes, rerun,
                   largest, held[k] if k < len(held) else 0, outputs[k] if k < len(outputs) else 0, inside,
                   checkpointed and k < plan.blocks, carried if k < p.blocks - 1 else 0, 0, p.param_bytes)
            for k in range(p.blocks)]


def predicted_peak(baseline_peak: int, live: Backward, p: BlockProfile, plan: Point,
                   optimizer: int | None = None) -> int:
    """The step's peak under ``plan`` from the baseline's peak and its timeline around the
    blocks (:func:`memscope.analysis.checkpoint_peak.peak_after`; ``optimizer``: the optimizer
    step's own peak, where measured apart)."""
    if plan.save is None or plan.blocks == 0:
        return baseline_peak
    return peak_after(baseline_peak, live, regions(p, plan), optimizer).bytes


def from_events(profile_events: list[dict[str, Any]], live_events: list[dict[str, Any]]) \
        -> tuple[BlockProfile, Backward | None] | None:
    """The block profile and the baseline's backward windows (None: not measured) from a run's
    ``sac_profile`` and ``sac_live`` events; None without a profile."""
    datas = [e["data"] for e in profile_events if isinstance(e.get("data"), dict)]
    if not datas:
        return None
    p = parse_profile(datas[0])
    lives = [e["data"] for e in live_events if isinstance(e.get("data"), dict)]
    return p, (parse_backward(lives[0], p) if lives else None)


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

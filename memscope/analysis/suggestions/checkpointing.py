"""activation_checkpointing, and the checkpoint plan the what-if trial applies.

The figure is the step's live-tensor peak now less the peak once checkpointed, as
memscope.analysis.checkpoint_peak models it (the model selective checkpointing and ``fit``'s
curve use: memscope.analysis.sac_plan): not the saved activations removed, since when backward
reaches a checkpointed block its forward is rerun and its saved tensors are live again, with
its backward's gradients beside them. Each block's figures come from the block's op profile
where the run took one (a plain run's ``block_profile``, a what-if baseline's ``sac_profile``),
else from its layer rows; what was live around each block's backward from the baseline's
measured windows (a what-if baseline's ``sac_live``), else modelled."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from memscope.analysis import sac_plan
from memscope.analysis.checkpoint_peak import Backward, PeakAfter, Region, modelled_backward, peak_after
from memscope.analysis.suggestions.facts import ACTIVATION_SHARE, MIN_SHARE, Facts, Suggestion, _b, _working_set, \
    transformers_model

_BLOCK = re.compile(r"^(?:(.*)\.)?(\d+)$")
# leaf layers whose backward reads their output, which they save (not their input)
_SAVES_OUTPUT = ("ReLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax")
NO_MODULE = "<no module>"  # the layer row of what code outside every module saved (the loss)


@dataclass
class CheckpointPlan:
    """What ``memscope whatif --try activation_checkpointing`` applies, and a user would write:

    * ``mode == "blocks"``: each repeated block (children of one type with layers of their own)
      wrapped in ``checkpoint(block, x)``: every block checkpointed, ``segments`` = the blocks;
    * ``mode == "sequential"``: ``checkpoint_sequential(container, segments, x)`` over the
      children of a Sequential. torch checkpoints segments of ``len // segments`` children and
      runs the last one (with the remainder) plainly: its activations are saved as usual.

    ``regions``: the blocks or segments as the peak model sees them; ``peak_now``: the step's
    live-tensor peak (measured, or without it the states, activations and working set);
    ``after``: the modelled peak once checkpointed; ``measured``: whether the timeline around the
    blocks' backward was measured (a what-if baseline) or modelled."""

    container: str
    blocks: list[dict[str, Any]]  # name, type, saved (own + descendants), output bytes
    mode: str
    segments: int
    regions: list[Region]
    in_blocks: int  # what the blocks save without checkpointing (layer rows)
    outside: int  # activations saved outside the blocks (unchanged)
    peak_now: int
    after: PeakAfter
    measured: bool = False
    source: str = "layer rows"  # the blocks' figures: "the block's op profile" or "layer rows"
    beside: int = 0  # modelled timeline: what is live beside the blocks through their backward
    states: int = 0  # of that, the model states

    @property
    def saving(self) -> int:
        return self.peak_now - self.after.bytes

    @property
    def kept(self) -> int:
        """What the checkpointed regions keep from their forward to their backward: their inputs
        and what they keep of their own (an output the next one takes as its input)."""
        return sum(r.held + r.kept + r.carried for r in self.regions if r.checkpointed)

    @property
    def plain(self) -> int:
        """What the last, not checkpointed segment saves (sequential mode; 0 for blocks)."""
        return sum(r.saved + r.held for r in self.regions if not r.checkpointed)

    @property
    def segment_size(self) -> int:
        return 1 if self.mode == "blocks" else len(self.blocks) // self.segments

    def as_json(self) -> dict[str, Any]:
        """The suggestion's ``peak`` object in ``report --json``."""
        return {"before_bytes": self.peak_now, "after_bytes": self.after.bytes, "at": self.after.at,
                "dropped_bytes": self.after.dropped, "timeline": "measured" if self.measured else "modelled",
                "parts": [{"part": name, "bytes": b} for name, b in self.after.parts]}


def activation_checkpointing(f: Facts) -> list[Suggestion]:
    """The peak now less the peak once checkpointed (:func:`checkpoint_plan`)."""
    if f.share(f.activations) < ACTIVATION_SHARE or f.evaluation:  # an evaluation: no_grad
        return []
    plan = checkpoint_plan(f)
    if plan is None:
        return []
    saving = plan.saving
    if saving <= 0 or f.share(saving) < MIN_SHARE:
        return []
    blocks = plan.blocks
    names = [b["name"] for b in blocks]
    span = f"{names[0]} … {names[-1]}" if len(names) > 2 else ", ".join(names)
    types = list(dict.fromkeys(b["type"] or "?" for b in blocks))
    kind = types[0] if len(types) == 1 else "/".join(types[:4])
    hf = transformers_model(f.layers)
    if plan.mode == "blocks" and hf:
        how = (f"call `model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
               f"{{\"use_reentrant\": False}})` before training ({hf} is a transformers model: it "
               f"checkpoints each of its {len(names)} {kind} blocks ({span}) itself, no library code "
               "to edit; with peft, call it on the model before get_peft_model, or on the PeftModel); "
               "backward recomputes each block's forward (about one extra forward pass of compute)")
        shape = f"each of the {len(names)} blocks checkpointed"
    elif plan.mode == "blocks":
        how = (f"wrap each of the {len(names)} {kind} blocks ({span}): in the parent's forward, "
               "`x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)` instead of "
               "`x = block(x)`; backward recomputes each block's forward (about one extra forward "
               "pass of compute)")
        shape = f"each of the {len(names)} blocks checkpointed"
    else:
        target = plan.container or "model"
        k = plan.segment_size
        how = (f"run {target} ({len(names)} layers {span}) through "
               f"`x = torch.utils.checkpoint.checkpoint_sequential({target}, {plan.segments}, x, "
               f"use_reentrant=False)` instead of `x = {target}(x)`: {plan.segments - 1} "
               f"checkpointed segment(s) of {k} layers, the last {len(names) - k * (plan.segments - 1)} "
               "run as usual; backward recomputes each checkpointed segment (up to one extra "
               "forward pass of compute)")
        shape = (f"{plan.segments} segments of {k} (torch leaves the last, "
                 f"{names[k * (plan.segments - 1)]} on, uncheckpointed: it saves {_b(plan.plain)})")
    return [Suggestion(
        "activation_checkpointing", saving,
        f"activations {_b(f.activations)} ({f.share(f.activations):.0%} of {_b(f.tensor_total)} "
        f"of tensors {f.basis}); {len(names)} numbered {kind} children of "
        f"{plan.container or '(model)'} save {_b(plan.in_blocks)} ({f.layer_source}); "
        f"{shape}: " + _peak_words(plan), how, peak=plan.as_json())]


def _peak_words(plan: CheckpointPlan) -> str:
    """The figure with its parts: the peak now and once checkpointed, what the forward's end
    loses, where the new peak is and what it adds up from."""
    a = plan.after
    parts = "".join((" - " if b < 0 else " + " if i else "") + f"{_b(abs(b))} {name}"
                    for i, (name, b) in enumerate(a.parts))
    timeline = ("each block's backward as measured" if plan.measured
                else f"their backward modelled: {_b(plan.beside)} beside them, model state {_b(plan.states)} "
                     "and what is saved outside them")
    what = "blocks" if plan.mode == "blocks" else "checkpointed segments"
    return (f"the step's live-tensor peak {_b(plan.peak_now)} becomes {_b(a.bytes)}: the {what} hold "
            f"{_b(plan.kept)} (their inputs) instead of saving {_b(plan.in_blocks)} ({_b(a.dropped)} less at "
            f"the end of the forward), and the highest point is now {a.at}: {parts} (from {plan.source}; "
            f"{timeline})")


def _saves_output(rows: dict[str, dict[str, Any]], block: dict[str, Any]) -> bool:
    """Whether the block saved its own output (charged to it: the next block's first layer, which
    saves the same storage, is not charged it): a layer of its own code whose saved bytes cover
    its output (a functional ReLU last: a residual block), or its last leaf a ReLU-like layer."""
    if not block["inner"]:
        return str(block["type"] or "") in _SAVES_OUTPUT and block["own"] >= block["output"] > 0
    if block["output"] > 0 and block["own"] >= block["output"]:
        return True
    name = block["name"]
    while True:
        kids = [k for k in rows if k.startswith(name + ".") and k[len(name) + 1:].isdigit()]
        if not kids:
            break
        name = max(kids, key=lambda k: int(k.rsplit(".", 1)[1]))
    r = rows[name]
    return name != block["name"] and str(r["type"] or "") in _SAVES_OUTPUT \
        and int(r["saved_bytes"] or 0) >= int(r["output_bytes"] or 0) == block["output"] > 0


def _biggest_saved(r: dict[str, Any]) -> int:
    """A lower bound of the biggest tensor a layer saved, from its row: the mean of what it
    saved, or its saved bytes less its other tensors taken as big as its output."""
    saved, count, out = int(r["saved_bytes"] or 0), max(1, int(r["saved_tensors"] or 1)), int(r["output_bytes"] or 0)
    return max(saved // count, saved - (count - 1) * out)


def _first_saves_output(rows: dict[str, dict[str, Any]], block: dict[str, Any]) -> bool:
    """Whether the block's first leaf layer saves its output, not its input (a ReLU): the input
    is then let go in the baseline, and the layer rows did not charge it to the block."""
    name = block["name"]
    while name + ".0" in rows:
        name += ".0"
    return str(rows[name]["type"] or "") in _SAVES_OUTPUT


def checkpoint_plan(f: Facts, selective: sac_plan.Point | None = None) -> CheckpointPlan | None:
    """The numbered children (a ModuleList's blocks, a Sequential's layers) that save the most,
    checkpointed the way the what-if trial does it (memscope.agent.whatif.techniques): repeated blocks
    one by one; a Sequential of mixed layers with ``checkpoint_sequential`` in the number of
    segments that leaves the lowest peak (the trial is told that number). ``selective``: a plan
    of the block profile's curve instead of whole-block checkpointing (None when the profiled
    blocks are not these)."""
    rows = {r["module"]: r for r in f.layers}
    containers: dict[str, list[str]] = {}
    for name in rows:
        m = _BLOCK.match(name or "")
        if m:
            containers.setdefault(m.group(1) or "", []).append(name)
    best = None
    for parent, names in containers.items():
        if len(names) < 2:
            continue
        names.sort(key=lambda n: int(n.rsplit(".", 1)[-1]))
        blocks = []
        for n in names:
            mine = [r for k, r in rows.items() if k == n or k.startswith(n + ".")]
            # the biggest tensor the block handles: its output, or a tensor one of its layers
            # saved: their mean, or what is left beside the others taken as big as its output
            # (an attention's N x N scores beside q, k, v)
            largest = max([int(rows[n]["output_bytes"] or 0)] + [_biggest_saved(r) for r in mine])
            blocks.append({"name": n, "type": rows[n]["type"], "saved": sum(int(r["saved_bytes"] or 0) for r in mine),
                           "own": int(rows[n]["saved_bytes"] or 0), "output": int(rows[n]["output_bytes"] or 0),
                           "largest": largest, "inner": any(k.startswith(n + ".") for k in rows)})
        total = sum(b["saved"] for b in blocks)
        if best is None or total > best[2]:
            best = (parent, blocks, total)
    if best is None or best[2] <= 0:
        return None
    parent, blocks, total = best
    count = len(blocks)
    # a block's input is the previous block's output; the first one's is what its first layer
    # saved where that is one storage (a convolution's or linear layer's input), else its output.
    # It is charged to the block where the block before did not save it (its first layer did)
    inputs = [blocks[i - 1]["output"] if i else _first_input(rows, blocks[0]) for i in range(count)]
    carried = [_saves_output(rows, b) for b in blocks]
    if carried[0] and blocks[0]["saved"] == blocks[1]["saved"]:
        inputs[0] = 0  # the first block saves what the second does: its input was saved before it
    outside = max(0, f.activations - total)
    states = f.parameters + f.gradients + f.optimizer_state
    peak = f.tensor_peak if f.tensor_peak is not None else states + f.activations + _working_set(f)
    # live beside the blocks through their backward: the model states, the activations saved
    # outside them but the loss's (freed by the loss's backward, before theirs), and the model's
    # output, which a script usually holds (``logits = model(x)``) until backward is done
    loss = int((rows.get(NO_MODULE) or {}).get("saved_bytes") or 0)
    output = int((rows.get("") or {}).get("output_bytes") or 0)
    beside = states + max(0, outside - loss) + output
    unmade = max(0, f.gradients - f.peak_grads) if f.peak_grads is not None else 0
    optimizer = f.step_peaks.optimizer if f.step_peaks is not None else None

    def plan_for(mode: str, segments: int, regions: list[Region], source: str,
                 live: Backward | None = None) -> CheckpointPlan:
        # modelled: the forward ends at the peak outside the optimizer's step (where known apart)
        model_peak = f.step_peaks.model if f.step_peaks is not None else peak
        timeline = live if live is not None else modelled_backward(model_peak, beside, regions, unmade, output)
        return CheckpointPlan(parent, blocks, mode, segments, regions, total, outside, peak,
                              peak_after(peak, timeline, regions, optimizer), live is not None, source, beside,
                              states)

    p = f.block_profile
    profiled = p is not None and p.container == parent and p.blocks == count
    if len({b["type"] for b in blocks}) == 1 and all(b["inner"] for b in blocks):
        # repeated blocks (choose_blocks in the agent): each wrapped, all checkpointed
        held = [0 if i and carried[i - 1] else inputs[i] for i in range(count)]
        if p is not None and profiled:
            pt = selective if selective is not None else sac_plan.point(p, frozenset())
            regions = sac_plan.regions(p, pt, held, [b["output"] for b in blocks])
            live = f.block_backward if f.block_backward is not None and len(f.block_backward.blocks) == count else None
            return plan_for("blocks", count, regions, "the block's op profile", live)
        if selective is not None:
            return None
        spans = [(i, i + 1) for i in range(count)]
        return plan_for("blocks", count, _row_regions(rows, blocks, inputs, carried, spans, False), "layer rows")
    container = rows.get(parent)
    if selective is not None or container is None or container["type"] != "Sequential":
        return None  # the trial checkpoints a Sequential's children only
    choice = None
    for segments in range(2, count + 1):
        k = count // segments
        last = k * (segments - 1)  # torch's first uncheckpointed child
        spans = [(i, i + k) for i in range(0, last, k)] + [(last, count)]
        plan = plan_for("sequential", segments, _row_regions(rows, blocks, inputs, carried, spans, True), "layer rows")
        if choice is None or plan.after.bytes < choice.after.bytes:  # a tie keeps fewer segments:
            choice = plan  # (segments - 1) * k layers are recomputed, fewer with fewer segments
    return choice


def _row_regions(rows: dict[str, dict[str, Any]], blocks: list[dict[str, Any]], inputs: list[int],
                 carried: list[bool], spans: list[tuple[int, int]], plain_last: bool) -> list[Region]:
    """The regions of the peak model from the layer rows: each span of blocks checkpointed but
    the last of a Sequential (checkpoint_sequential runs it plainly). A region's input is held
    (by its checkpoint, or saved by its first layer as before) unless the block before saved it
    (then that block keeps it: the next region's input); what it saved besides, recomputed in
    backward with the biggest tensor it makes beside (the op being rerun), and as many again
    for the gradient of that tensor in its backward."""
    out = []
    for j, (a, b) in enumerate(spans):
        held = 0 if a and carried[a - 1] else inputs[a]
        extra = held if _first_saves_output(rows, blocks[a]) else 0
        held -= extra
        saved = max(0, sum(x["saved"] for x in blocks[a:b]) - held)
        largest = max(x["largest"] for x in blocks[a:b])
        carry = blocks[b - 1]["output"] if b < len(blocks) and carried[b - 1] else 0
        span = blocks[a]["name"] if b - a == 1 else f"{blocks[a]['name']} … {blocks[b - 1]['name']}"
        name = span if not plain_last else f"segment {j} ({span})"
        out.append(Region(name, saved, 0, saved + largest, largest, held, blocks[b - 1]["output"],
                          None, not (plain_last and j == len(spans) - 1), min(carry, saved), extra))
    return out


def _first_input(rows: dict[str, dict[str, Any]], block: dict[str, Any]) -> int:
    """The size of the first block's input: a container's first input is made before it (an
    image batch of 3 channels ahead of 32-channel maps), and its checkpoint keeps it. The first
    leaf layer (``.0`` down the block) that saved exactly one storage saved its input (Conv2d,
    Linear; a ReLU its output, the same size); otherwise the block's output size stands for it."""
    name = block["name"]
    while name + ".0" in rows:
        name += ".0"
    saved, count = int(rows[name]["saved_bytes"] or 0), int(rows[name]["saved_tensors"] or 0)
    leaf = name != block["name"] or not block["inner"]
    if leaf and count == 1 and saved > 0:
        return min(int(block["output"]), saved) if block["output"] else saved
    return int(block["output"])

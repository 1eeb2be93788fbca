"""activation_checkpointing, and the checkpoint plan the what-if trial applies."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from memscope.analysis.suggestions.facts import ACTIVATION_SHARE, MIN_SHARE, Facts, Suggestion, _b, _working_set, \
    transformers_model

_BLOCK = re.compile(r"^(?:(.*)\.)?(\d+)$")


@dataclass
class CheckpointPlan:
    """What ``memscope whatif --try activation_checkpointing`` applies, and a user would write:

    * ``mode == "blocks"``: each repeated block (children of one type with layers of their own)
      wrapped in ``checkpoint(block, x)``: every block checkpointed, ``segments`` = the blocks;
    * ``mode == "sequential"``: ``checkpoint_sequential(container, segments, x)`` over the
      children of a Sequential. torch checkpoints segments of ``len // segments`` children and
      runs the last one (with the remainder) plainly: its activations are saved as usual."""

    container: str
    blocks: list[dict[str, Any]]  # name, type, saved (own + descendants), output bytes
    mode: str
    segments: int
    kept: int  # the checkpointed segments' inputs, kept from the forward into the backward
    plain: int  # what the last, not checkpointed segment saves (sequential mode)
    work: int  # the costliest checkpointed segment's saved bytes, recomputed during backward
    grads: int  # gradients alive while that segment is back-propagated
    in_blocks: int  # what the blocks save without checkpointing
    outside: int  # activations outside the blocks (unchanged)
    working: int = 0  # the working set at the peak besides saved tensors (see below)
    held: int = -1  # kept inputs still alive while that segment is back-propagated (-1: all)

    @property
    def after(self) -> int:
        """Activations at the peak once checkpointed: the larger of

        * the end of the forward: the kept inputs, what is saved outside the blocks and by the
          plain segment, plus the working set the baseline had at its peak (the op output being
          made, the loss and its gradient: checkpointing does not change them);
        * the backward of the costliest checkpointed segment: backward runs the segments last
          to first and frees each one's kept input when it is done, so only the inputs of that
          segment and the ones before it are still held; plus its activations recomputed and
          the gradients alive while a layer in it is back-propagated (the gradient of the
          layer's output and the one it computes for its input: at most twice the biggest
          tensor in the segment). A CNN's first, widest segments set this peak."""
        held = self.kept if self.held < 0 else self.held
        return max(self.kept + self.outside + self.plain + self.working, held + self.work + self.grads)

    @property
    def before(self) -> int:
        """The same moment without checkpointing: every saved activation plus the working set."""
        return self.in_blocks + self.outside + self.working

    @property
    def segment_size(self) -> int:
        return 1 if self.mode == "blocks" else len(self.blocks) // self.segments


def activation_checkpointing(f: Facts) -> list[Suggestion]:
    """Keep only the input of each checkpointed segment; during backward one segment at a time
    is recomputed, so its activations come back as the recompute working set."""
    if f.share(f.activations) < ACTIVATION_SHARE or f.evaluation:  # an evaluation: no_grad
        return []
    plan = checkpoint_plan(f)
    if plan is None:
        return []
    saving = plan.before - plan.after
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
        f"{shape}: they keep {_b(plan.kept)} of segment inputs; in backward the largest "
        f"segment comes back ({_b(plan.work)}) with {_b(plan.grads)} of gradients; "
        f"{_b(plan.outside)} outside the blocks stays"
        + (f"; working set at the peak {_b(plan.working)}" if plan.working else ""),
        how)]


def checkpoint_plan(f: Facts) -> CheckpointPlan | None:
    """The numbered children (a ModuleList's blocks, a Sequential's layers) that save the most,
    checkpointed the way the what-if trial does it (memscope.agent.whatif.techniques): repeated blocks
    one by one; a Sequential of mixed layers with ``checkpoint_sequential`` in the number of
    segments that leaves the fewest activations (the trial is told that number)."""
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
            saved = sum(int(r["saved_bytes"] or 0) for k, r in rows.items()
                        if k == n or k.startswith(n + "."))
            # the biggest tensor the block handles: its output, or a tensor one of its layers
            # saved (a layer's saved bytes over its tensor count: their mean, a lower bound)
            largest = max([int(rows[n]["output_bytes"] or 0)] + [
                int(r["saved_bytes"] or 0) // max(1, int(r["saved_tensors"] or 1))
                for k, r in rows.items() if k == n or k.startswith(n + ".")])
            blocks.append({"name": n, "type": rows[n]["type"], "saved": saved,
                           "own": int(rows[n]["saved_bytes"] or 0),
                           "output": int(rows[n]["output_bytes"] or 0), "largest": largest,
                           "inner": any(k.startswith(n + ".") for k in rows)})
        total = sum(b["saved"] for b in blocks)
        if best is None or total > best[2]:
            best = (parent, blocks, total)
    if best is None or best[2] <= 0:
        return None
    parent, blocks, total = best
    outside = max(0, f.activations - total)
    working = _working_set(f)
    # a block's input is the previous block's output; the first one's is taken as its own output
    inputs = [blocks[i - 1]["output"] if i else blocks[0]["output"] for i in range(len(blocks))]

    def recomputed(start: int, end: int) -> tuple[int, int]:
        """What backward brings back for the segment blocks[start:end], and its gradients.
        The segment's input is kept by the checkpoint; unless the layer that made it saved it
        (then it is charged outside the segment), the baseline charged it to the layer in the
        segment that saved it first, and on recompute that layer saves the kept storage again:
        not new memory, so it is taken out (a segment whose first layers save no input, a ReLU,
        is understated by that much; the forward end usually sets the peak there)."""
        saved = sum(b["saved"] for b in blocks[start:end])
        prev = blocks[start - 1] if start else None
        by_producer = prev is not None and prev["output"] > 0 and prev["own"] >= prev["output"]
        if not by_producer:
            saved -= min(inputs[start], saved)
        return saved, 2 * max(b["largest"] for b in blocks[start:end])

    def costliest(starts: list[int], size: int) -> tuple[int, int, int]:
        """(inputs held, recomputed bytes, gradients) of the checkpointed segment whose backward
        costs most, counting the inputs of it and of the segments before it (still held)."""
        best, held = (0, 0, 0), 0
        for i in starts:
            held += inputs[i]
            work, grads = recomputed(i, i + size)
            if held + work + grads > sum(best):
                best = (held, work, grads)
        return best

    if len({b["type"] for b in blocks}) == 1 and all(b["inner"] for b in blocks):
        # repeated blocks (choose_blocks in the agent): each wrapped, all checkpointed
        held, work, grads = costliest(list(range(len(blocks))), 1)
        return CheckpointPlan(parent, blocks, "blocks", len(blocks), sum(inputs), 0,
                              work, grads, total, outside, working, held)
    container = rows.get(parent)
    if container is None or container["type"] != "Sequential":
        return None  # the trial checkpoints a Sequential's children only
    count, choice = len(blocks), None
    for segments in range(2, count + 1):
        k = count // segments
        last = k * (segments - 1)  # torch's first uncheckpointed child
        starts = range(0, last, k)
        kept = sum(inputs[i] for i in starts)
        held, work, grads = costliest(list(starts), k)
        # the plain segment saves as before, and its input (the last checkpoint's output) stays
        # alive to the end of the forward: checkpoint_sequential's local variable holds it
        plain = sum(b["saved"] for b in blocks[last:]) + inputs[last]
        plan = CheckpointPlan(parent, blocks, "sequential", segments, kept, plain, work, grads,
                              total, outside, working, held)
        if choice is None or plan.after < choice.after:  # a tie keeps fewer segments:
            choice = plan  # (segments - 1) * k layers are recomputed, fewer with fewer segments
    return choice

"""Suggestions: which memory-saving techniques apply to a run, and how much each would save.

Pure functions over a run file (no torch). Each rule reads measured numbers (the breakdown at
the peak, the per-layer saved bytes of the profiled step nearest the peak, the parameter and
optimizer tensors of the last inventory, the CUDA allocator samples, the detected leaks) and
returns a :class:`Suggestion` only when the technique applies: not mixed precision for a run
that is already 16-bit, not checkpointing when activations are a small share, not sharding on
one process. Savings are bytes of the training peak; the list is ranked by saving.

The share thresholds compare against the tensor total of the breakdown (parameters, gradients,
optimizer state, activations; plus ``other`` on CUDA, where it is allocator bytes of tensors).
On CPU ``other`` is host RSS of the interpreter and libraries, which no technique changes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from memscope.analysis.selective import selective_suggestions
from memscope.analysis.hotspots import layer_rows
from memscope.analysis.leaks import has_inventories, suggestions as leak_suggestions
from memscope.analysis.oom_limits import attention_scores
from memscope.analysis.oom import ABSURD_REQUEST, demand, fragmentation
from memscope.analysis.unexplained import suggestion as unexplained_suggestion
from memscope.analysis.workers import suggestion as workers_suggestion
from memscope.analysis.frameworks import framework_how, framework_of
from memscope.analysis.summary import RunSummary, summarize
from memscope.store.reader import RunReader

ACTIVATION_SHARE = 0.30  # activations at least this share of the tensors: checkpointing, accumulation
OPTIMIZER_SHARE = 0.25  # optimizer state at least this share: lighter optimizer, offload
MIN_SHARE = 0.05  # a suggestion saving less than this share of the tensors is not worth the change
MIN_SAVING = 1 << 20  # nor one saving less than 1 MiB (leak fixes excepted: leaks keep growing)
ADAM_RATIO = 1.5  # optimizer state / trainable parameter bytes above this: two states per parameter
ACCUMULATION = 2  # gradient accumulation: the micro-batch is divided by this
NF4_BYTES = 4.5 / 8  # 4-bit NF4 weights with one fp32 absmax per 64 weights (QLoRA, no double quant)
FRAGMENTED_SHARE = 0.10  # inactive split bytes at least this share of reserved: fragmented
ELEM = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1}
LOW_PRECISION = ("float16", "bfloat16")
# Modules whose saved tensors autocast leaves in fp32: norms take the fp32 residual stream,
# embeddings save integer indices. Everything else the forward saves, and what a loss computed
# on the forward's 16-bit output saves, becomes 16-bit under the model's autocast.
# Modules whose saved tensors stay fp32 under autocast: embeddings (not autocast), and the norms
# of the residual stream (LayerNorm, RMSNorm: their input is the fp32 residual) and GroupNorm
# (on autocast's fp32 list on CUDA). BatchNorm is on no list and follows its input: after a
# 16-bit convolution it saves 16-bit tensors, and so does the ReLU after it. Max pooling saves
# int64 indices (its input is usually charged to the layer before it): they do not shrink.
_KEEPS_FP32 = re.compile(r"LayerNorm|RMSNorm|GroupNorm|Embedding|MaxPool")
_ATTENTION = re.compile(r"attn|attention", re.IGNORECASE)
_BLOCK = re.compile(r"^(?:(.*)\.)?(\d+)$")


@dataclass
class Suggestion:
    technique: str
    estimated_saving_bytes: int
    evidence: str
    how: str

    def as_json(self) -> dict[str, Any]:
        return {"technique": self.technique, "estimated_saving_bytes": self.estimated_saving_bytes,
                "evidence": self.evidence, "how": self.how}


@dataclass
class Facts:
    """The measured numbers the rules read, gathered once."""

    device: str
    world_size: int
    steps: int
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    other: int
    tensor_total: int
    layers: list[dict[str, Any]]  # layer_stats rows of the profiled step nearest the peak
    layer_step: int | None
    param_groups: list[dict[str, Any]]  # inventory groups of the parameters (last inventory)
    activation_dtypes: dict[str, int]  # bytes of inventoried tensors with a grad_fn, by dtype
    cuda_peak: dict[str, Any] | None  # the cuda_samples row where reserved was highest
    tensor_peak: int | None = None  # exact live tensor bytes peak (``tensor_peak`` option: what-ifs)
    oom_allocator: dict[str, Any] | None = None  # the CUDA allocator's state at the run's OOM
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF already has expandable_segments
    layer_scale: float | None = None  # layer rows scaled from the profiled step to the OOM's activations
    basis: str = "at the peak"  # the moment the numbers describe
    device_total: int | None = None  # the GPU's memory (NVML), or the --simulate-gpu cap
    micro_batches: int | None = None  # forwards per optimizer step in the profiled step (accumulation)
    closure_forwards: int = 0  # of those, evaluations of an optimizer's closure (LBFGS)
    attention_scores: int = 0  # N x N attention scores live at the OOM (its census), bytes

    @property
    def layer_source(self) -> str:
        """Where the per-layer numbers come from, for the evidence."""
        text = f"profiled step {self.layer_step}"
        if self.layer_scale:
            text += f", scaled x{self.layer_scale:.1f} to the activations live at the out-of-memory error"
        return text

    def share(self, n: int) -> float:
        return n / self.tensor_total if self.tensor_total else 0.0

    @property
    def trainable_bytes(self) -> int:
        b = sum(g["bytes"] for g in self.param_groups if g["requires_grad"])
        return b or self.parameters


def suggest(reader: RunReader, summary: RunSummary | None = None) -> list[Suggestion]:
    """The techniques that apply to this run, biggest estimated saving first."""
    s = summary if summary is not None else summarize(reader)
    facts = gather(reader, s)
    out: list[Suggestion] = []
    if facts is not None:
        for rule in RULES:
            out.extend(x for x in rule(facts) if x.estimated_saving_bytes >= MIN_SAVING)
        _framework_first(out, framework_of(reader), facts)
    out.extend(Suggestion(**d) for d in leak_suggestions(s.leaks, s.steps))
    out.extend(Suggestion(**d) for d in selective_suggestions(reader))  # a profiled block only
    if s.unexplained is not None:
        out.append(Suggestion(**unexplained_suggestion(s.unexplained, s.steps)))
    if s.workers is not None:
        out.append(Suggestion(**workers_suggestion(s.workers)))
    out.sort(key=lambda x: (-x.estimated_saving_bytes, x.technique))
    return out


def _framework_first(items: list[Suggestion], framework: str | None, f: Facts) -> None:
    """Put the framework's own switch before each plain-PyTorch change it replaces."""
    if framework is None or f.closure_forwards:
        return  # a closure optimizer (LBFGS) is a plain loop's: the generic advice is its own
    micro = max(1, f.micro_batches or 1)
    for x in items:
        way = framework_how(framework, x.technique, micro)
        if way:
            x.how = f"{way}; in plain PyTorch: {x.how}"


def gather(reader: RunReader, s: RunSummary) -> Facts | None:
    proc = s.main_proc
    bd = s.peak.breakdown or {}  # none without a profiled step: only the allocator rule applies
    at_failure = s.peak.breakdown_at_failure
    if not at_failure and s.oom is not None and s.oom.kind == "oom" and s.oom.breakdown_at_failure \
            and (s.oom.proc is None or s.oom.proc == s.main_proc):
        # a run that ran out of memory is judged at the failure, where memory ran out, whatever
        # step its host RSS (which rarely falls) peaked in
        at_failure = True
    basis = "at the peak"
    if at_failure and s.oom is not None:
        bd = demand(s.oom) or bd
        basis = "at the out-of-memory error"
        req = s.oom.requested_bytes
        if req is not None and req <= ABSURD_REQUEST and s.oom.phase in ("forward", "backward", "optimizer"):
            basis += f" (live, plus the {_b(req)} it failed to allocate)"
    if proc is None:
        return None
    cuda = s.device.startswith("cuda")
    keys = ("parameters", "gradients", "optimizer_state", "activations")
    total = sum(int(bd.get(k) or 0) for k in keys) + (int(bd.get("other") or 0) if cuda else 0)
    layers = layer_rows(reader, proc, s.hotspot_step) if s.hotspot_step is not None else []
    params: list[dict[str, Any]] = []
    act_dtypes: dict[str, int] = {}
    if has_inventories(reader):
        last = reader.scalar("SELECT max(step) FROM inventories WHERE proc = ?", (proc,))
        if last is not None:
            params = reader.query(
                "SELECT dtype, shape, requires_grad, sum(bytes) AS bytes FROM inventory_groups "
                "WHERE proc = ? AND step = ? AND category = 'parameters' "
                "GROUP BY dtype, shape, requires_grad", (proc, last))
        for r in reader.query(
                "SELECT dtype, sum(bytes + graph_bytes) AS b FROM inventory_groups WHERE proc = ? "
                "AND category = 'activations' AND grad_fn IS NOT NULL GROUP BY dtype", (proc,)):
            act_dtypes[r["dtype"]] = int(r["b"] or 0)
    cuda_peak = None
    if cuda:
        rows = reader.query("SELECT * FROM cuda_samples WHERE reserved IS NOT NULL "
                            "ORDER BY reserved DESC, t LIMIT 1")
        cuda_peak = rows[0] if rows else None
    scale = None
    if at_failure and layers and s.hotspot_step is not None:
        # the breakdown is the failing step's (a bigger batch, often): per-layer numbers of the
        # profiled step are scaled to the activations measured live at the failure
        prof = reader.scalar("SELECT activations FROM step_breakdown WHERE proc = ? AND step = ?",
                             (proc, s.hotspot_step))
        live = int(bd.get("activations") or 0)
        if prof and live > prof:
            scale = live / int(prof)
            layers = [{**r, "saved_bytes": int((r["saved_bytes"] or 0) * scale),
                       "output_bytes": int((r["output_bytes"] or 0) * scale)} for r in layers]
    oom_alloc, expandable = _allocator_facts(reader, s)
    world = max([int(p.get("world_size") or 1) for p in s.processes] or [1])
    peaks = [int(e["data"]["peak_bytes"]) for e in reader.events("tensor_peak")
             if isinstance(e["data"], dict) and e["data"].get("peak_bytes") is not None]
    return Facts(device=s.device, world_size=world, steps=s.steps,
                 device_total=_device_total(reader) if cuda else None,
                 parameters=int(bd.get("parameters") or 0), gradients=int(bd.get("gradients") or 0),
                 optimizer_state=int(bd.get("optimizer_state") or 0),
                 activations=int(bd.get("activations") or 0), other=int(bd.get("other") or 0),
                 tensor_total=total, layers=layers, layer_step=s.hotspot_step,
                 param_groups=params, activation_dtypes=act_dtypes, cuda_peak=cuda_peak,
                 tensor_peak=max(peaks) if peaks else None, oom_allocator=oom_alloc,
                 expandable_segments=expandable, layer_scale=scale, basis=basis,
                 micro_batches=s.hotspot_micro_batches, closure_forwards=s.hotspot_closure_forwards,
                 attention_scores=attention_scores(s.oom.data) if at_failure and s.oom is not None else 0)


def _allocator_facts(reader: RunReader, s: RunSummary) -> tuple[dict[str, Any] | None, bool]:
    """The CUDA allocator's state at the run's OOM (when it was read there), and whether
    expandable segments were already on (the OOM record, the agent's ``cuda_allocator`` event,
    an imported snapshot's allocator settings)."""
    d = s.oom.data if s.oom is not None and s.oom.kind == "oom" else {}
    state = d if d.get("reserved_bytes") is not None and d.get("inactive_split_bytes") is not None else None
    on = bool(d.get("expandable_segments"))
    for ev in reader.events("cuda_allocator"):
        on = on or bool(isinstance(ev["data"], dict) and ev["data"].get("expandable_segments"))
    for ev in reader.events("snapshot"):
        settings = ev["data"].get("allocator_settings") if isinstance(ev["data"], dict) else None
        on = on or bool(isinstance(settings, dict) and settings.get("expandable_segments") is True)
    return state, on


# -- the rules -----------------------------------------------------------------------------------

def mixed_precision(f: Facts) -> list[Suggestion]:
    """The model's forward under bf16 autocast (what ``memscope whatif --try mixed_precision``
    applies). Each term of the saving at the peak is a tensor that changes size:

    * saved for backward by modules autocast runs in 16-bit (matmuls, and what consumes their
      16-bit outputs): half their bytes, BatchNorm after a convolution included. Layer, RMS and
      group norms and embeddings keep fp32 (autocast's fp32 list; the residual stream that
      feeds the norms stays fp32). Code after the model (a loss on its
      output, outside any module or as its own module) gets the 16-bit output and halves too;
    * the model's own input, when a 16-bit layer saves it (the first layer of a Sequential): the
      script still holds the fp32 batch, so the layer's 16-bit copy adds half its bytes instead
      of saving them;
    * the 16-bit copy autocast makes of each weight matrix, saved for backward by its matmul:
      2 bytes per weight, a cost;
    * the working set at the peak besides the saved tensors and the model states (the op output
      being made, the logits the script holds, the loss gradient): outputs and gradients of
      16-bit ops, so half. Known exactly only from a what-if baseline (its live-tensor peak);
      taken as 0 otherwise."""
    pbytes = sum(g["bytes"] for g in f.param_groups)
    fp32_params = sum(g["bytes"] for g in f.param_groups if g["dtype"] in ("float32", "float64"))
    if pbytes and fp32_params < 0.5 * pbytes:
        return []  # the model itself is 16-bit already
    if _float64_share(f) >= 0.5:
        return []  # autocast casts only float32 tensors: single_precision comes first
    low = sum(b for d, b in f.activation_dtypes.items() if d in LOW_PRECISION)
    if low and low >= 0.5 * sum(f.activation_dtypes.values()):
        return []  # activations seen at step boundaries are 16-bit: autocast is on
    model_input = 0
    if f.layers:
        total = sum(int(r["saved_bytes"] or 0) for r in f.layers)
        kept = sum(int(r["saved_bytes"] or 0) for r in f.layers if not _halves(r))
        model_input = _input_saved_by_16bit_layer(f.layers)
        # saved bytes summed over the step can exceed the most alive at once (the breakdown's)
        halvable = max(0, min(total - kept, f.activations) - model_input)
        basis = (f"{_b(halvable)} saved for backward by modules autocast runs in 16-bit and by "
                 f"code after the model, {_b(kept)} by layer/group norms and embeddings (kept fp32)")
        if model_input:
            basis += f", {_b(model_input)} of the model's fp32 input (held by the script: copied)"
    else:
        halvable = f.activations
        basis = f"{_b(halvable)} of fp32 activations (no per-layer profile to refine it)"
    if f.param_groups:
        copies = 2 * sum(g["bytes"] // ELEM.get(g["dtype"], 4) for g in f.param_groups
                         if g["requires_grad"] and _ndim(g["shape"]) >= 2
                         and g["dtype"] in ("float32", "float64"))
        copies_of = "weight matrices"
    else:
        # no inventory (what-if runs take none): every fp32 parameter counted as cast, an upper
        # bound (biases, norm weights and untied embedding tables are not copied for backward)
        copies = f.parameters // 2
        copies_of = "parameters (no inventory: all counted)"
    working = _working_set(f)
    saving = halvable // 2 - model_input // 2 - copies + working // 2
    if saving <= 0 or f.share(saving) < MIN_SHARE:
        return []
    dev = "cuda" if f.device.startswith("cuda") else "cpu"
    parts = [f"halving those saves {_b(halvable // 2)}"]
    if working:
        parts.append(f"halving the {_b(working)} working set at the peak (live-tensor peak minus "
                     f"states and saved activations) {_b(working // 2)}")
    parts.append(f"minus {_b(copies)} of bf16 copies of {copies_of} autocast keeps for backward")
    if model_input:
        parts.append(f"minus {_b(model_input // 2)} for the bf16 copy of the input")
    return [Suggestion(
        "mixed_precision", saving,
        f"parameters are fp32 ({_b(fp32_params or f.parameters)}) and activations fp32; {basis}; "
        + "; ".join(parts),
        f'run the model\'s forward under autocast: `with torch.autocast("{dev}", '
        "dtype=torch.bfloat16): out = model(x)`, and the loss, backward and optimizer.step() "
        "after it as before (the loss then works on the 16-bit output); bf16 needs no "
        "GradScaler. With fp16 instead (GPUs without bf16), add `scaler = torch.amp.GradScaler()`: "
        "`scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`. "
        "Weights, gradients and optimizer state stay fp32.")]


def _float64_share(f: Facts) -> float:
    """The share of the parameters' bytes that are float64 (0 without an inventory)."""
    pbytes = sum(g["bytes"] for g in f.param_groups)
    return sum(g["bytes"] for g in f.param_groups if g["dtype"] == "float64") / pbytes if pbytes else 0.0


def single_precision(f: Facts) -> list[Suggestion]:
    """A float64 model (``.double()``, ``set_default_dtype(torch.float64)``): autocast leaves
    float64 tensors alone, so mixed precision would change nothing; float32 halves the float64
    share of the parameters, gradients and optimizer state, and the float64 activations."""
    share = _float64_share(f)
    if share < 0.5:
        return []
    acts = sum(f.activation_dtypes.values())
    act_share = f.activation_dtypes.get("float64", 0) / acts if acts else share
    states = int((f.parameters + f.gradients + f.optimizer_state) * share)
    activations = int(f.activations * act_share)
    saving = (states + activations) // 2
    if saving <= 0 or f.share(saving) < MIN_SHARE:
        return []
    return [Suggestion(
        "single_precision", saving,
        f"{share:.0%} of the parameters are float64, and {act_share:.0%} of the activations; "
        f"autocast casts only float32 tensors, so mixed precision would change nothing here; "
        f"float32 halves {_b(states)} of parameters, gradients and optimizer state and "
        f"{_b(activations)} of activations {f.basis}",
        "build the model and its inputs in float32 (drop `.double()`, `dtype=torch.float64`, "
        "`torch.set_default_dtype(torch.float64)`) and check the loss still converges (float32 "
        "keeps about 7 significant digits); autocast (mixed_precision) can then halve the "
        "activations again")]


def _working_set(f: Facts) -> int:
    """Live tensor bytes at the peak besides the model states and the saved activations: the op
    output being made, tensors the script holds (logits), the loss gradient. Known only from the
    exact live-tensor peak of a what-if baseline; 0 otherwise. States are counted live at the
    peak (gradients of the previous step too): a lower bound, so no saving is overstated."""
    if f.tensor_peak is None:
        return 0
    states = f.parameters + f.gradients + f.optimizer_state
    return max(0, f.tensor_peak - states - f.activations)


def _halves(row: dict[str, Any]) -> bool:
    """Whether what the module saves becomes 16-bit once the model's forward runs under
    autocast. Code outside modules and loss modules called on their own (``"Class:"`` roots)
    run after the forward on its 16-bit output, so they halve (integer targets they save do
    not: a few bytes per sample)."""
    return not _KEEPS_FP32.search(row["type"] or "")


def _input_saved_by_16bit_layer(layers: list[dict[str, Any]]) -> int:
    """Bytes the first layer of a Sequential model saves when that layer runs in 16-bit: the
    model's input, which the script holds in fp32 (only a Sequential says which child comes
    first; for other models the input's copy is not seen)."""
    rows = {r["module"]: r for r in layers}
    root = rows.get("")
    if root is None or root["type"] != "Sequential":
        return 0
    kids = sorted((int(n), n) for n in rows if n and n.isdigit())
    for _, n in kids:
        inner = [r for k, r in rows.items() if k.startswith(n + ".") and int(r["saved_bytes"] or 0)]
        if inner:
            return 0  # a block: which of its layers sees the input first is not known
        r = rows[n]
        if int(r["saved_bytes"] or 0) > 0:
            return int(r["saved_bytes"]) if _halves(r) else 0
    return 0


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
    if f.share(f.activations) < ACTIVATION_SHARE:
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
    if plan.mode == "blocks":
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


def checkpoint_plan_for(reader: RunReader, summary: RunSummary | None = None) -> CheckpointPlan | None:
    """The checkpointing plan the estimator models for this run (what-if trials apply it)."""
    s = summary if summary is not None else summarize(reader)
    facts = gather(reader, s)
    return checkpoint_plan(facts) if facts is not None else None


def gradient_accumulation(f: Facts) -> list[Suggestion]:
    """Activations scale with the micro-batch: dividing it by k divides them by k."""
    if f.share(f.activations) < ACTIVATION_SHARE:
        return []
    k = ACCUMULATION
    saving = f.activations - f.activations // k
    n = max(1, (f.micro_batches or 1) - f.closure_forwards)  # the script's own micro-batches
    if f.closure_forwards:  # LBFGS-style: the optimizer re-evaluates the whole loss in a closure
        how = (f"the optimizer evaluates a closure ({f.closure_forwards} forwards in the step, each "
               f"of the whole batch): inside the closure, run the batch in {k} parts and call "
               f"`(loss_fn(model(part), target_part) / {k}).backward()` on each, returning the "
               "summed loss: the optimizer sees the same loss and gradients (up to BatchNorm "
               "statistics), at the cost of smaller, slower matmuls")
    elif n > 1:  # the script already accumulates: more, smaller micro-batches
        how = (f"the script already accumulates {n} micro-batches per optimizer step: divide the "
               f"micro-batch by {k} and accumulate {n * k} (each loss divided by {n * k}): the same "
               "effective batch and the same gradients (up to BatchNorm statistics), at the cost of "
               "smaller, slower matmuls")
    else:
        how = (f"divide the batch size by {k} and call optimizer.step() / zero_grad() every {k} "
               f"micro-batches, with `(loss / {k}).backward()`: the same effective batch and the same "
               "gradients (up to BatchNorm statistics), at the cost of smaller, slower matmuls")
    return [Suggestion(
        "gradient_accumulation", saving,
        f"activations {_b(f.activations)} are {f.share(f.activations):.0%} of {_b(f.tensor_total)} "
        f"of tensors {f.basis} and scale with the micro-batch; a {k}x smaller micro-batch keeps "
        f"{_b(f.activations // k)}", how)]


def efficient_attention(f: Facts) -> list[Suggestion]:
    """An attention module whose subtree (its own forward and its children's) saves more than
    its input, q, k, v and output saves the N x N scores (softmax output, masks).
    scaled_dot_product_attention keeps those five n x d tensors and a logsumexp per row, so the
    subtree is taken to need 5 x the module's output bytes after the change."""
    hits: list[tuple[str, str, int, int, int]] = []
    for r in sorted(f.layers, key=lambda r: r["module"] or ""):
        name, kind = r["module"] or "", r["type"] or ""
        if not (_ATTENTION.search(kind) or _ATTENTION.search(name.rsplit(".", 1)[-1])):
            continue
        if any(name.startswith(h[0] + ".") for h in hits):
            continue  # inside an attention module already counted
        saved = sum(int(x["saved_bytes"] or 0) for x in f.layers
                    if x["module"] == name or (x["module"] or "").startswith(name + "."))
        out = int(r["output_bytes"] or 0)
        excess = saved - 5 * out
        if out and excess > out:
            hits.append((name, kind, saved, out, excess))
    saving = min(sum(h[4] for h in hits), f.activations)
    if not hits:
        return _scores_at_failure(f)
    if f.share(saving) < MIN_SHARE:
        return []
    names = ", ".join(h[0] for h in hits[:4]) + (f" and {len(hits) - 4} more" if len(hits) > 4 else "")
    h0 = hits[0]
    return [Suggestion(
        "efficient_attention", saving,
        f"{len(hits)} attention module(s) ({names}) save far more than their input, q, k, v and "
        f"output: {h0[0]} ({h0[1]}) saves {_b(h0[2])} with its children for an output of "
        f"{_b(h0[3])} ({f.layer_source}): the N x N attention scores kept for backward",
        _attention_how(f, [h[0] for h in hits], {h[1] for h in hits}))]


def _scores_at_failure(f: Facts) -> list[Suggestion]:
    """Without a per-layer profile (an OOM in step 0): the N x N scores the census found live
    at the failure, which scaled_dot_product_attention's fused kernels never store."""
    saving = min(f.attention_scores, f.activations)
    if not saving or f.share(saving) < MIN_SHARE:
        return []
    return [Suggestion(
        "efficient_attention", saving,
        f"attention scores (N x N per head, saved by softmax, dropout and scores @ v) were "
        f"{_b(saving)} of the {_b(f.activations)} of activations {f.basis}",
        _attention_how(f, [], set()))]


_TORCH_TRANSFORMER_LAYERS = ("TransformerEncoderLayer", "TransformerDecoderLayer")


def _attention_how(f: Facts, names: list[str], kinds: set[str]) -> str:
    """torch's own Transformer layers already call nn.MultiheadAttention with need_weights=False:
    their scores are stored because scaled_dot_product_attention fell back to its math kernel.
    On CPU, attention dropout does that (its flash kernel takes no dropout; measured on a 2-head
    MultiheadAttention over 35 tokens: 1.8 MiB saved with dropout 0.2, 0.9 MiB with 0)."""
    types = {str(r["module"] or ""): str(r["type"] or "") for r in f.layers}
    parents = {types.get(n.rsplit(".", 1)[0], "") if "." in n else "" for n in names}
    cpu = not f.device.startswith("cuda")
    if kinds == {"MultiheadAttention"} and parents and parents <= set(_TORCH_TRANSFORMER_LAYERS):
        kernel = ("on CPU the flash kernel takes no attention dropout: build the layers with "
                  "dropout=0.0 (it is their feed-forward dropout too), or train on CUDA, whose "
                  "memory-efficient kernel takes dropout" if cpu else
                  "find which fused kernel refuses it with `with torch.nn.attention.sdpa_kernel("
                  "SDPBackend.EFFICIENT_ATTENTION):` around the forward (the error says why)")
        return (f"torch's {' / '.join(sorted(parents))} already calls nn.MultiheadAttention with "
                "need_weights=False, so scaled_dot_product_attention fell back to its math "
                f"kernel, which stores the scores: {kernel}")
    how = ("replace the explicit `softmax(q @ k.transpose(-2, -1) / sqrt(d)) @ v` (and its mask) "
           "with `torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)` "
           "(or attn_mask=...): flash / memory-efficient kernels never store the N x N scores; "
           "nn.MultiheadAttention uses them only when called with need_weights=False")
    if cpu:
        how += ("; on CPU the flash kernel takes no dropout: with attention dropout (dropout_p > 0, "
                "or nn.MultiheadAttention's dropout) the math kernel runs and stores the scores again")
    return how


def lighter_optimizer(f: Facts) -> list[Suggestion]:
    """Two states per parameter (Adam, AdamW) -> one (SGD with momentum): saves one copy."""
    trainable = f.trainable_bytes
    if not trainable or f.share(f.optimizer_state) < OPTIMIZER_SHARE:
        return []
    ratio = f.optimizer_state / trainable
    if ratio < ADAM_RATIO:
        return []
    if f.closure_forwards and ratio > 2 * ADAM_RATIO:
        return _shorter_history(f, trainable, ratio)
    saving = f.optimizer_state - trainable
    return [Suggestion(
        "lighter_optimizer", saving,
        f"optimizer state {_b(f.optimizer_state)} is {ratio:.1f}x the {_b(trainable)} of trainable "
        f"parameters ({f.share(f.optimizer_state):.0%} of {_b(f.tensor_total)} of tensors): two "
        "states per parameter, Adam-like; SGD with momentum keeps one",
        "torch.optim.SGD(params, lr=..., momentum=0.9) keeps one state (saves this estimate; needs "
        "its own learning-rate tuning); to keep Adam's behaviour, 8-bit Adam "
        "(bitsandbytes.optim.AdamW8bit, CUDA) saves about 3/4 of the state, and a factored optimizer "
        "(Adafactor: transformers.optimization.Adafactor) nearly all of it")]


LBFGS_DEFAULT_HISTORY = 100  # torch.optim.LBFGS's history_size
LBFGS_SHORT_HISTORY = 10  # what lighter_optimizer proposes instead


def _shorter_history(f: Facts, trainable: int, ratio: float) -> list[Suggestion]:
    """A closure optimizer whose state is many copies of the parameters: LBFGS keeps two flat
    vectors per iteration (``old_dirs``, ``old_stps``) up to ``history_size``, plus two working
    ones (``d``, ``prev_flat_grad``). The history grows for the first 100 iterations, so the
    state measured early in a run is not yet its largest."""
    pairs = max(0, round((ratio - 2) / 2))
    kept = (2 * LBFGS_SHORT_HISTORY + 2) * trainable
    full = (2 * LBFGS_DEFAULT_HISTORY + 2) * trainable
    saving = f.optimizer_state - kept
    if saving <= 0 or f.share(saving) < MIN_SHARE:
        return []
    grows = (f"; it keeps growing to about {_b(full)} at the default history_size of "
             f"{LBFGS_DEFAULT_HISTORY}" if pairs < LBFGS_DEFAULT_HISTORY else "")
    return [Suggestion(
        "lighter_optimizer", saving,
        f"optimizer state {_b(f.optimizer_state)} is {ratio:.0f}x the {_b(trainable)} of trainable "
        f"parameters and the optimizer evaluates a closure: a history of flat copies of the "
        f"parameters (LBFGS: two per iteration, {pairs} pairs so far){grows}",
        f"torch.optim.LBFGS(params, history_size={LBFGS_SHORT_HISTORY}) bounds it at "
        f"{2 * LBFGS_SHORT_HISTORY + 2} copies of the parameters ({_b(kept)}); a shorter history "
        "approximates the curvature less well: check that the loss still converges")]


def optimizer_offload(f: Facts) -> list[Suggestion]:
    """On a GPU, optimizer state can live in host memory and be updated there."""
    if not f.device.startswith("cuda") or f.share(f.optimizer_state) < OPTIMIZER_SHARE:
        return []
    return [Suggestion(
        "optimizer_offload", f.optimizer_state,
        f"optimizer state {_b(f.optimizer_state)} is {f.share(f.optimizer_state):.0%} of "
        f"{_b(f.tensor_total)} of GPU tensors {f.basis}",
        "keep the optimizer state in CPU memory: DeepSpeed ZeRO-Offload "
        '(`"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}`) or FSDP '
        "with `cpu_offload=CPUOffload(offload_params=True)`; the optimizer step then runs on the "
        "CPU and gradients cross PCIe every step (slower steps)")]


def sharding(f: Facts) -> list[Suggestion]:
    """ZeRO-3 / FSDP full sharding keeps 1/W of parameters, gradients and optimizer state."""
    w = f.world_size
    if w < 2:
        return []
    states = f.parameters + f.gradients + f.optimizer_state
    saving = states - states // w
    if f.share(saving) < MIN_SHARE:
        return []
    return [Suggestion(
        "sharding", saving,
        f"{w} ranks each hold all parameters {_b(f.parameters)}, gradients {_b(f.gradients)} and "
        f"optimizer state {_b(f.optimizer_state)}; sharded over {w} ranks each keeps 1/{w}",
        "wrap the model in FSDP (`torch.distributed.fsdp.fully_shard(block)` per block, then on "
        "the model; or FullyShardedDataParallel) or DeepSpeed ZeRO stage 3; ZeRO-1 (optimizer "
        f"state only, saves {_b(f.optimizer_state - f.optimizer_state // w)}) and ZeRO-2 (plus "
        "gradients) communicate less. Skip if the model is already sharded")]


def quantization(f: Facts) -> list[Suggestion]:
    """Frozen weight matrices (requires_grad False) can be stored in 4-bit."""
    frozen = [g for g in f.param_groups if not g["requires_grad"] and _ndim(g["shape"]) >= 2
              and ELEM.get(g["dtype"], 0) >= 2]
    fbytes = sum(g["bytes"] for g in frozen)
    numel = sum(g["bytes"] // ELEM[g["dtype"]] for g in frozen)
    saving = fbytes - int(numel * NF4_BYTES)
    if saving <= 0 or f.share(fbytes) < OPTIMIZER_SHARE:
        return []
    return [Suggestion(
        "quantization", saving,
        f"{_b(fbytes)} of frozen weight matrices ({numel:,} weights, requires_grad=False) are "
        f"{f.share(fbytes):.0%} of {_b(f.tensor_total)} of tensors; 4-bit NF4 stores "
        f"{NF4_BYTES * 8:g} bits per weight",
        "load the frozen base model in 4-bit (transformers: "
        '`BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", '
        "bnb_4bit_compute_dtype=torch.bfloat16)`, or bitsandbytes.nn.Linear4bit) and train "
        "LoRA adapters on top (QLoRA); needs CUDA, dequantises per matmul (slower)")]


def allocator_config(f: Facts) -> list[Suggestion]:
    """Inactive split blocks are reserved memory no allocation can reuse: fragmentation. Read at
    the OOM when the run had one (the cache held enough free bytes for the request but no block
    that large, or split blocks were a large share of reserved), else at the highest reserved
    sample. Not suggested when expandable segments are already on: they are the fix."""
    if f.expandable_segments:
        return []
    d = f.oom_allocator
    if d is not None:
        frag = fragmentation(d)
        if frag is None:
            return []
        reserved, split = frag["reserved_bytes"], frag["split_bytes"]
        blocked = ""
        if frag["blocked"]:
            blocked = (f"; the cache held {_b(frag['cached_free_bytes'])} free but its largest block was "
                       f"{_b(frag['largest_free_block_bytes'])}, less than the {_b(frag['requested_bytes'])} "
                       "asked for: fragmentation caused the out-of-memory error")
        retries = int(d.get("alloc_retries") or 0)
        evidence = (f"at the out-of-memory error ({_b(reserved)} reserved, {_b(int(d.get('allocated_bytes') or 0))} "
                    f"allocated) {_b(split)} ({split / reserved:.0%} of reserved) sat in inactive split "
                    "blocks" + blocked + (f"; {retries} allocation retries (cache flushes)" if retries else ""))
        return [Suggestion("allocator_config", split, evidence, _ALLOCATOR_HOW)]
    r = f.cuda_peak
    if r is None or not r.get("reserved") or r.get("inactive_split") is None:
        return []
    reserved, split = int(r["reserved"]), int(r["inactive_split"])
    allocated = int(r.get("allocated") or 0)
    retries = int(r.get("alloc_retries") or 0)
    if split < FRAGMENTED_SHARE * reserved:
        return []
    return [Suggestion(
        "allocator_config", split,
        f"at the highest reserved memory ({_b(reserved)} reserved, {_b(allocated)} allocated) "
        f"{_b(split)} ({split / reserved:.0%} of reserved) sat in inactive split blocks "
        "(fragmentation)" + (f"; {retries} allocation retries (cache flushes)" if retries else ""),
        _ALLOCATOR_HOW)]


_ALLOCATOR_HOW = ("set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in the environment before the "
                  "script starts (segments grow in place instead of splitting fixed blocks)")


def _device_total(reader: RunReader) -> int | None:
    """The memory the run had: the --simulate-gpu cap when one applied, else NVML's total."""
    caps = [int(e["data"]["simulate_gpu_bytes"]) for e in reader.events("simulate_gpu")
            if isinstance(e["data"], dict) and e["data"].get("simulate_gpu_bytes")]
    if caps:
        return min(caps)
    total = reader.scalar("SELECT max(total) FROM nvml_samples")
    return int(total) if total else None


NEAR_LIMIT = 0.90  # reserved at least this share of the device: plan for it (fit_plan)


def fit_plan(f: Facts) -> list[Suggestion]:
    """A run near its GPU's limit: the cheapest combination of techniques that leaves the CUDA
    context and the fragmentation allowance free, as ``memscope fit`` ranks plans
    (memscope.analysis.fit), with peaks composed from the other rules' estimated savings."""
    from memscope.analysis import fit as planning

    r = f.cuda_peak
    if not f.device_total or r is None or not r.get("reserved"):
        return []
    reserved = int(r["reserved"])
    if reserved < NEAR_LIMIT * f.device_total:
        return []
    peak = int(r.get("allocated_peak") or r.get("allocated") or reserved)
    allowance = planning.Allowance()
    usable = allowance.usable(f.device_total)
    savings = {s.technique: s.estimated_saving_bytes
               for rule in (mixed_precision, activation_checkpointing, gradient_accumulation,
                            lighter_optimizer, sharding) for s in rule(f)}
    plans = planning.plan_from_savings(peak, usable, savings, f.activations, f.world_size)
    chosen = next((p for p in plans if p.fits), None)
    if chosen is None:
        chosen = min(plans, key=lambda p: p.peak_bytes) if plans else None
    if chosen is None or peak - chosen.peak_bytes <= 0:
        return []
    names = " + ".join(t["technique"] for t in chosen.techniques)
    verdict = "the cheapest plan that fits" if chosen.fits else "no plan of these fits; the one that saves most"
    size = f"{f.device_total / 2**30:.0f}GiB"
    return [Suggestion(
        "fit_plan", peak - chosen.peak_bytes,
        f"{_b(reserved)} reserved at the highest, {reserved / f.device_total:.0%} of the "
        f"{_b(f.device_total)} device ({_b(peak)} allocated); {allowance.describe(f.device_total)}",
        f"{verdict}: {names} (predicted allocator peak {_b(chosen.peak_bytes)} of "
        f"{_b(usable)} usable; cost: {chosen.cost}), composed from the other suggestions' savings; for "
        f"plans measured by fake runs of the script, with the largest micro-batch: "
        f"`memscope fit --gpu {size} SCRIPT.py ARGS`")]


RULES: list[Callable[[Facts], list[Suggestion]]] = [
    single_precision, mixed_precision, activation_checkpointing, gradient_accumulation, efficient_attention,
    lighter_optimizer, optimizer_offload, sharding, quantization, allocator_config, fit_plan,
]


def _ndim(shape: Any) -> int:
    try:
        v = json.loads(shape) if isinstance(shape, str) else shape
        return len(v) if isinstance(v, list) else 0
    except (TypeError, ValueError):
        return 0


def _b(n: int | float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def suggest_for(summary: RunSummary) -> list[Suggestion]:
    """:func:`suggest` for a summary already made, reading its run file again (reports get only
    the summary; the file is opened read-only, safe while the run is still written)."""
    with RunReader(summary.path) as reader:
        return suggest(reader, summary)

"""What the rules read: the measured facts of a run gathered once (:func:`gather`), the
:class:`Suggestion` each rule returns, and the thresholds and helpers they share."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from memscope.analysis import sac_plan
from memscope.analysis.hotspots import layer_rows
from memscope.analysis.leaks import has_inventories
from memscope.analysis.oom import ABSURD_REQUEST, demand
from memscope.analysis.oom_limits import attention_scores
from memscope.analysis.step_peaks import StepPeaks, from_event, top_event
from memscope.analysis.summary import RunSummary
from memscope.store.reader import RunReader
from memscope.units import human_bytes

ACTIVATION_SHARE = 0.30  # activations at least this share of the tensors: checkpointing, accumulation
OPTIMIZER_SHARE = 0.25  # optimizer state at least this share: lighter optimizer, offload
MIN_SHARE = 0.05  # a suggestion saving less than this share of the tensors is not worth the change
MIN_SAVING = 1 << 20  # nor one saving less than 1 MiB (leak fixes excepted: leaks keep growing)
NEAR_PEAK_RESERVED = 0.90  # allocator_config reads fragmentation at samples this close to the highest reserved
ELEM = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1}
LOW_PRECISION = ("float16", "bfloat16")


@dataclass
class Suggestion:
    technique: str
    estimated_saving_bytes: int
    evidence: str
    how: str
    # the peak the figure is computed from, where it is modelled (activation_checkpointing:
    # memscope.analysis.suggestions.checkpointing.CheckpointPlan.as_json); None elsewhere
    peak: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {"technique": self.technique, "estimated_saving_bytes": self.estimated_saving_bytes,
                "evidence": self.evidence, "how": self.how, "peak": self.peak}


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
    # exact live tensor bytes peak: ``tensor_peak`` events (every step of a what-if baseline, one
    # step of a plain CPU run), on CUDA the allocator's peak; None: not measured
    tensor_peak: int | None = None
    # of the step's starting .grad bytes, those still live at that peak (None: files from before)
    peak_grads: int | None = None
    # the step's phase when it peaked: forward, backward, optimizer, other (None: files from before)
    peak_phase: str | None = None
    # the same step's peak outside its optimizer's step and in it (memscope.analysis.step_peaks):
    # a change to one side lowers the step's peak only down to the other; None: not known
    step_peaks: StepPeaks | None = None
    oom_allocator: dict[str, Any] | None = None  # the CUDA allocator's state at the run's OOM
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF already has expandable_segments
    layer_scale: float | None = None  # layer rows scaled from the profiled step to the OOM's activations
    basis: str = "at the peak"  # the moment the numbers describe
    device_total: int | None = None  # the GPU's memory (NVML), or the --simulate-gpu cap
    micro_batches: int | None = None  # forwards per optimizer step in the profiled step (accumulation)
    closure_forwards: int = 0  # of those, evaluations of an optimizer's closure (LBFGS)
    attention_scores: int = 0  # N x N attention scores live at the OOM (its census), bytes
    # module -> {kernel: calls}: the scaled_dot_product_attention kernels (math, flash, efficient,
    # cudnn) its own forward ran in the profiled step (the agent's ``attention_kernels`` event)
    attention_kernels: dict[str, dict[str, int]] = field(default_factory=dict)
    # the run failed in an evaluation with autograd on (the model in eval mode, activations saved)
    evaluation: bool = False
    evaluation_saved: int = 0  # ... the activations it had saved for backward then (the census's)
    # the optimizer whose step ran out of memory (class, trainable and state bytes), else None
    failed_optimizer: dict[str, Any] | None = None
    # class names of the optimizers that stepped in the profiled step, when more than one (a GAN)
    optimizers: list[str] = field(default_factory=list)
    # one repeated block's op-level profile (``sac_profile`` event: a plain run's block profile,
    # a what-if baseline's) and, where measured, the blocks' backward windows (``sac_live``)
    block_profile: sac_plan.BlockProfile | None = None
    block_backward: sac_plan.Backward | None = None

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
    def model_peak(self) -> int | None:
        """The live-tensor peak outside the optimizer's step where that is known apart
        (``step_peaks``), else the step's (``tensor_peak``)."""
        return self.step_peaks.model if self.step_peaks is not None else self.tensor_peak

    @property
    def trainable_bytes(self) -> int:
        b = sum(g["bytes"] for g in self.param_groups if g["requires_grad"])
        return b or self.parameters


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
        # Near the highest reserved memory (within NEAR_PEAK_RESERVED of it), the sample where
        # most of it sat in inactive split blocks. The first sample at the very highest alone was
        # taken until a GPU run of examples/scenarios/fragment.py showed that one read after
        # the script freed its fragmented blocks (reserved stays, the split is gone).
        rows = reader.query("SELECT * FROM cuda_samples WHERE reserved IS NOT NULL AND reserved >= "
                            "(SELECT ? * max(reserved) FROM cuda_samples) "
                            "ORDER BY coalesce(inactive_split, 0) DESC, reserved DESC, t LIMIT 1",
                            (NEAR_PEAK_RESERVED,))
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
    top = top_event(reader)
    grads_at_peak = top.get("start_grad_bytes_at_peak")
    tensor_peak = int(top["peak_bytes"]) if top else None
    if tensor_peak is None and not at_failure:
        tensor_peak = _cuda_tensor_peak(reader, s, proc, bd)
    return Facts(device=s.device, world_size=world, steps=s.steps,
                 device_total=_device_total(reader) if cuda else None,
                 parameters=int(bd.get("parameters") or 0), gradients=int(bd.get("gradients") or 0),
                 optimizer_state=int(bd.get("optimizer_state") or 0),
                 activations=int(bd.get("activations") or 0), other=int(bd.get("other") or 0),
                 tensor_total=total, layers=layers, layer_step=s.hotspot_step,
                 param_groups=params, activation_dtypes=act_dtypes, cuda_peak=cuda_peak,
                 tensor_peak=tensor_peak, oom_allocator=oom_alloc,
                 peak_grads=int(grads_at_peak) if isinstance(grads_at_peak, int) else None,
                 peak_phase=top.get("phase") if isinstance(top.get("phase"), str) else None,
                 # a closure optimizer (LBFGS) runs forwards in its step: not two sides
                 step_peaks=None if at_failure or s.hotspot_closure_forwards else from_event(top),
                 expandable_segments=expandable, layer_scale=scale, basis=basis,
                 micro_batches=s.hotspot_micro_batches, closure_forwards=s.hotspot_closure_forwards,
                 attention_scores=attention_scores(s.oom.data) if at_failure and s.oom is not None else 0,
                 attention_kernels=_attention_kernels(reader, proc, s.hotspot_step),
                 evaluation=bool(at_failure and s.oom is not None and s.oom.evaluation),
                 evaluation_saved=int((s.oom.breakdown or {}).get("activations", 0))
                 if at_failure and s.oom is not None and s.oom.evaluation else 0,
                 failed_optimizer=_failed_optimizer(s),
                 optimizers=_optimizers(reader, proc, s.hotspot_step),
                 **_block_profile(reader, at_failure))


def _block_profile(reader: RunReader, at_failure: bool) -> dict[str, Any]:
    """``block_profile`` and ``block_backward`` (a damaged event: neither). Not at a failure:
    the windows were measured in a step that did not fail."""
    try:
        found = sac_plan.from_events(reader.events("sac_profile"), reader.events("sac_live"))
    except ValueError:
        return {}
    if found is None:
        return {}
    return {"block_profile": found[0], "block_backward": None if at_failure else found[1]}


def _failed_optimizer(s: RunSummary) -> dict[str, Any] | None:
    opt = s.oom.data.get("optimizer") if s.oom is not None and s.oom.kind == "oom" else None
    return opt if isinstance(opt, dict) and opt.get("class") else None


def _optimizers(reader: RunReader, proc: int, step: int | None) -> list[str]:
    """The optimizers that stepped, from the agent's ``optimizers`` event of the profiled step
    (written when there are several)."""
    for e in reader.events("optimizers"):
        d = e["data"]
        if e["proc"] in (None, proc) and isinstance(d, dict) and d.get("step") == step \
                and isinstance(d.get("optimizers"), list):
            return [str(x) for x in d["optimizers"]]
    return []


def _cuda_tensor_peak(reader: RunReader, s: RunSummary, proc: int, bd: dict[str, int]) -> int | None:
    """On CUDA, the live-tensor peak from the allocator: the peak step's high-water mark (exact,
    read without resetting the program's counters), less what was allocated at the step's start
    beyond the model states: cuBLAS workspaces (32 MiB a thread on an H100, and autograd's
    backward runs on a thread of its own), a dataset kept on the GPU, caches. None of that
    scales with the batch or shrinks with a technique; counted, it would be taken for the working
    set beside the activations (real nanoGPT run: 68 MiB of the 359 MiB peak)."""
    peak = s.peak
    if peak.metric != "cuda_allocated" or not peak.bytes or peak.step is None or peak.proc not in (None, proc):
        return None
    before = reader.scalar("SELECT end_allocated FROM steps WHERE proc = ? AND step = ? AND status = 'ok'",
                           (proc, peak.step - 1))
    if before is None:
        return None  # the first step: nothing to tell the workspaces from
    states = sum(int(bd.get(k) or 0) for k in ("parameters", "gradients", "optimizer_state"))
    return int(peak.bytes) - max(0, int(before) - states)


def _attention_kernels(reader: RunReader, proc: int, step: int | None) -> dict[str, dict[str, int]]:
    """The SDPA kernels each module ran in the profiled step the layer rows come from (files
    from before the event, or runs without SDPA: empty)."""
    out: dict[str, dict[str, int]] = {}
    for e in reader.events("attention_kernels"):
        d = e["data"]
        if e["proc"] not in (None, proc) or not isinstance(d, dict) or d.get("step") != step:
            continue
        for module, kernels in (d.get("modules") or {}).items():
            if isinstance(kernels, dict):
                out[str(module)] = {str(k): int(n) for k, n in kernels.items() if isinstance(n, int)}
    return out


def sdpa_kernels(f: Facts, name: str) -> set[str]:
    """The SDPA kernels module ``name`` and the modules under it ran ('' is the whole model)."""
    return {k for m, ks in f.attention_kernels.items()
            if not name or m == name or m.startswith(name + ".") for k in ks}


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


def _device_total(reader: RunReader) -> int | None:
    """The memory the run had: the --simulate-gpu cap when one applied, else NVML's total."""
    caps = [int(e["data"]["simulate_gpu_bytes"]) for e in reader.events("simulate_gpu")
            if isinstance(e["data"], dict) and e["data"].get("simulate_gpu_bytes")]
    if caps:
        return min(caps)
    total = reader.scalar("SELECT max(total) FROM nvml_samples")
    return int(total) if total else None


def _working_set(f: Facts) -> int:
    """Live tensor bytes at the peak (the model side's, where the step's optimizer step peaks on
    its own: ``Facts.model_peak``) besides the model states and the saved activations: the op
    output being made, tensors the script holds (logits), the loss gradient. Known from the
    live-tensor peak (``Facts.tensor_peak``); 0 without it. States are counted live at the
    peak (gradients of the previous step too): a lower bound, so no saving is overstated."""
    peak = f.model_peak
    if peak is None:
        return 0
    states = f.parameters + f.gradients + f.optimizer_state
    return max(0, peak - states - f.activations)


def _float64_share(f: Facts) -> float:
    """The share of the parameters' bytes that are float64 (0 without an inventory)."""
    pbytes = sum(g["bytes"] for g in f.param_groups)
    return sum(g["bytes"] for g in f.param_groups if g["dtype"] == "float64") / pbytes if pbytes else 0.0


def _ndim(shape: Any) -> int:
    try:
        v = json.loads(shape) if isinstance(shape, str) else shape
        return len(v) if isinstance(v, list) else 0
    except (TypeError, ValueError):
        return 0


def _b(n: int | float) -> str:
    """Bytes in the one unit style of every text output (memscope.units.human_bytes)."""
    return human_bytes(n)


# class names of transformers' PreTrainedModel heads (and peft's wrappers around them)
HF_MODEL = re.compile(r"^(?:PeftModel\w*|\w+(?:LMHeadModel|PreTrainedModel|For(?:CausalLM|MaskedLM|Seq2SeqLM|"
                      r"SequenceClassification|TokenClassification|QuestionAnswering|"
                      r"ConditionalGeneration|ImageClassification|PreTraining)))$")


def transformers_model(layers: list[dict[str, Any]]) -> str | None:
    """The class of the outermost transformers model in a profile (a PreTrainedModel: it has
    ``gradient_checkpointing_enable()``, computes its loss in float32), or None."""
    for r in sorted(layers, key=lambda r: len(str(r["module"] or "").split(".")) if r["module"] else 0):
        if HF_MODEL.match(str(r["type"] or "")):
            return str(r["type"])
    return None

"""mixed_precision: the model's forward under bf16 autocast."""

from __future__ import annotations

import re
from typing import Any

from memscope.analysis.suggestions.facts import ELEM, HF_MODEL, LOW_PRECISION, MIN_SHARE, Facts, Suggestion, _b, \
    _float64_share, _ndim, _working_set, transformers_model

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
_MATMUL = re.compile(r"^(?:Linear|Conv1D|LazyLinear)$")  # modules that save their input for a matmul


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
      2 bytes per weight, a cost. Frozen matrices too: a frozen weight's copy is saved when its
      matmul's input needs a gradient (every layer after a LoRA adapter: counting trainable
      matrices only put a peft LoRA GPT-2's figure 41% above the measured saving). Where nothing
      before a frozen matmul trains (a frozen backbone under a trained head) its copy is not
      kept and the saving is understated;
    * the working set at the peak besides the saved tensors and the model states (the op output
      being made, the logits the script holds, the loss gradient): outputs and gradients of
      16-bit ops, so half; not where the step peaked in the optimizer's step (the update's
      temporaries, unless a closure's forward runs there) nor where other models run beside the
      first (a GAN's generator, profiled as ``Generator:main.0``: much of it is theirs, a batch
      from the data loader too; not counted, a lower bound). Known exactly only from a
      live-tensor peak; taken as 0 otherwise. Where the step's two peaks are known apart
      (``Facts.step_peaks``) it is the working set at the peak outside the optimizer's step, and
      the saving at the step's peak stops at the optimizer step's peak, which autocast leaves
      alone (memscope.analysis.step_peaks);
    * one fp32 input feeding several matmuls (ng-video-lecture's per-head key / query / value
      projections of one LayerNorm output): fp32, one storage serves them all; under autocast each
      matmul casts and saves its own 16-bit copy. The profile charges the shared input to its
      first consumer; a matmul that saved nothing beside one that did (same output size, same
      grandparent) is taken to add a half-size copy of it.

    A transformers model (a PreTrainedModel, peft's wrappers too) computes its loss in float32
    (``logits.float()`` before the cross entropy): its own saved bytes (the log-probabilities)
    stay fp32, and the logits working set does not shrink (a 16-bit copy beside the fp32 one).
    On CPU its attention (scaled_dot_product_attention, transformers' default) runs the math
    kernel, which computes 16-bit inputs in float32: what it saves stays fp32 too. So does what
    any module saves whose own forward the agent saw run that math kernel (the
    ``attention_kernels`` event: nanoGPT's attention, dropout 0.2 on CPU). Measured with
    ``memscope whatif`` on the scripts of benchmarks/advice_accuracy.py."""
    pbytes = sum(g["bytes"] for g in f.param_groups)
    fp32_params = sum(g["bytes"] for g in f.param_groups if g["dtype"] in ("float32", "float64"))
    if pbytes and fp32_params < 0.5 * pbytes:
        return []  # the model itself is 16-bit already
    if _float64_share(f) >= 0.5:
        return []  # autocast casts only float32 tensors: single_precision comes first
    low = sum(b for d, b in f.activation_dtypes.items() if d in LOW_PRECISION)
    if low and low >= 0.5 * sum(f.activation_dtypes.values()):
        return []  # activations seen at step boundaries are 16-bit: autocast is on
    model_input = fanout = 0
    hf = transformers_model(f.layers)
    cpu = not f.device.startswith("cuda")
    fp32_attention = bool(hf) and cpu
    # modules whose own forward ran SDPA's math kernel on CPU: it computes 16-bit inputs in
    # float32 and saves fp32 scores, dropout mask and q / k / v copies (nanoGPT's attention)
    math = {m for m, ks in f.attention_kernels.items() if "math" in ks} if cpu else set()
    others = _other_models(f.layers)
    if f.layers:
        total = sum(int(r["saved_bytes"] or 0) for r in f.layers)
        kept = sum(int(r["saved_bytes"] or 0) for r in f.layers
                   if not _halves(r, fp32_attention) or str(r["module"] or "") in math)
        math_kept = sum(int(r["saved_bytes"] or 0) for r in f.layers if str(r["module"] or "") in math)
        model_input = _input_saved_by_16bit_layer(f.layers)
        fanout = _fanout_copies(f.layers)
        # saved bytes summed over the step can exceed the most alive at once (the breakdown's)
        halvable = max(0, min(total - kept, f.activations) - model_input)
        kept_by = "layer/group norms and embeddings"
        if hf:
            kept_by += f", {hf}'s float32 loss" + (" and its attention (CPU math kernel)" if fp32_attention else "")
        if math_kept and not hf:
            kept_by += (f" and scaled_dot_product_attention's math kernel ({_b(math_kept)} in "
                        f"{_names(sorted(math))}: on CPU it stores the N x N scores and computes 16-bit "
                        "inputs in float32; attention dropout sends SDPA there (the CPU flash kernel takes "
                        "no dropout, CUDA's fused kernels do))")
        basis = (f"{_b(halvable)} saved for backward by modules autocast runs in 16-bit and by "
                 f"code after the model, {_b(kept)} by {kept_by} (kept fp32)")
        if model_input:
            basis += f", {_b(model_input)} of the model's fp32 input (held by the script: copied)"
    else:
        halvable = f.activations
        basis = f"{_b(halvable)} of fp32 activations (no per-layer profile to refine it)"
    if f.param_groups:
        copies = 2 * sum(g["bytes"] // ELEM.get(g["dtype"], 4) for g in f.param_groups
                         if _ndim(g["shape"]) >= 2 and g["dtype"] in ("float32", "float64"))
        copies_of = "weight matrices"
    else:
        # no inventory (what-if runs take none): every fp32 parameter counted as cast, an upper
        # bound (biases, norm weights and untied embedding tables are not copied for backward)
        copies = f.parameters // 2
        copies_of = "parameters (no inventory: all counted)"
    # Not halved: a float32 loss keeps fp32 logits beside 16-bit ones; in the optimizer's step
    # (not a closure's forward there: LBFGS) the working set is the update's temporaries
    # (pytorch/examples mnist: Adadelta's for fc1's 4.5 MiB weight, halved 1.82 MiB of a
    # 2.48 MiB figure; whatif measured 322 B); beside other models much of it is theirs
    # (pytorch/examples dcgan: 2.19 MiB of a 2.83 MiB figure, its generator's second graph and a
    # batch; autocasting both models saves 0.85 MiB by a profiler's count, the discriminator
    # alone, what whatif tries, costs 96 KB)
    # With the step's two peaks known apart (f.step_peaks), the working set is the model side's,
    # and the saving at the step's peak stops at the optimizer step's peak, which autocast does
    # not change (pytorch/examples mnist at batch 20: 2.75 MiB off backward's peak, 1.02 MiB
    # above the optimizer's: the figure was 2.75 MiB, whatif measured 1.02 MiB)
    halves_working = not hf and (f.step_peaks is not None or f.peak_phase != "optimizer"
                                 or bool(f.closure_forwards)) and not others
    working = _working_set(f) if halves_working else 0
    model_side = halvable // 2 - model_input // 2 - copies + working // 2 - fanout
    if model_side <= 0:
        return []
    saving = f.step_peaks.saving(model_side) if f.step_peaks is not None else model_side
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
    if fanout:
        parts.append(f"minus {_b(fanout)} of bf16 copies of fp32 inputs shared by several matmuls "
                     "(each casts its own)")
    capped = f.step_peaks.capped(model_side) if f.step_peaks is not None else ""
    return [Suggestion(
        "mixed_precision", saving,
        f"parameters are fp32 ({_b(fp32_params or f.parameters)}) and activations fp32; {basis}; "
        + "; ".join(parts) + capped,
        f'run the model\'s forward under autocast: `with torch.autocast("{dev}", '
        "dtype=torch.bfloat16): out = model(x)`, and the loss, backward and optimizer.step() "
        "after it as before (the loss then works on the 16-bit output); bf16 needs no "
        "GradScaler. With fp16 instead (GPUs without bf16), add `scaler = torch.amp.GradScaler()`: "
        "`scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`. "
        "Weights, gradients and optimizer state stay fp32." + _bce_note(f.layers))]


def _bce_note(layers: list[dict[str, Any]]) -> str:
    """What to change where the profile shows an ``nn.BCELoss``: it takes no 16-bit input (on
    CPU a dtype error against the fp32 target, on CUDA autocast refuses it as unsafe), so the
    loss after an autocast forward fails at its first step (pytorch/examples dcgan: whatif's
    mixed_precision trial does)."""
    if not any(str(r["type"] or "") == "BCELoss" for r in layers):
        return ""
    return (" This script's nn.BCELoss takes no bfloat16 input and fails on the autocast output: drop "
            "the model's final Sigmoid and use nn.BCEWithLogitsLoss (autocast runs it in float32, and it "
            "is the numerically safer form), or keep BCELoss on `output.float()`.")


def _other_models(layers: list[dict[str, Any]]) -> set[str]:
    """Roots of models called beside the first one in the step (a GAN's generator beside its
    discriminator): a root whose modules are profiled as ``Root:child`` (a loss module called on
    its own is a root without children)."""
    return {name.split(":", 1)[0] for r in layers if ":" in (name := str(r["module"] or ""))}


def _names(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _halves(row: dict[str, Any], fp32_attention: bool = False) -> bool:
    """Whether what the module saves becomes 16-bit once the model's forward runs under
    autocast. Code outside modules and loss modules called on their own (``"Class:"`` roots)
    run after the forward on its 16-bit output, so they halve (integer targets they save do
    not: a few bytes per sample)."""
    kind = str(row["type"] or "")
    if _KEEPS_FP32.search(kind) or HF_MODEL.match(kind):
        return False
    name = str(row["module"] or "").rsplit(".", 1)[-1]
    return not (fp32_attention and (_ATTENTION.search(kind) or _ATTENTION.search(name)))


def _fanout_copies(layers: list[dict[str, Any]]) -> int:
    """Bytes of the 16-bit copies autocast adds for an fp32 input shared by several matmuls: a
    matmul module that saved nothing of its own (the profile charged the shared input to the
    first consumer) with a twin that saved an input: the same output size, and the same parent
    (sibling projections of one head) or a sibling parent of the same type (the projections of
    sibling heads). Each adds half the twin's saved input. Children of a Sequential
    are a chain, not a fan-out (the second Linear's input is the activation before it, charged
    there); a matmul that saved nothing because its weight is frozen and its input needs no
    gradient has no twin."""
    types = {str(r["module"] or ""): str(r["type"] or "") for r in layers}

    def place(name: str) -> tuple[str, str, str]:
        parent, _, leaf = name.rpartition(".")
        return parent, types.get(parent, ""), leaf

    def matmul(r: dict[str, Any]) -> bool:
        return bool(_MATMUL.match(str(r["type"] or ""))) and place(str(r["module"] or ""))[1] != "Sequential"

    savers = [(place(str(r["module"] or "")), int(r["output_bytes"] or 0), int(r["saved_bytes"]))
              for r in layers if matmul(r) and int(r["saved_bytes"] or 0) > 0]
    extra = 0
    for r in layers:
        if not matmul(r) or int(r["saved_bytes"] or 0) or not int(r["calls"] or 0):
            continue
        (parent, ptype, _), out = place(str(r["module"] or "")), int(r["output_bytes"] or 0)
        twins = [saved for (sp, st, _), so, saved in savers if so == out
                 and (sp == parent or (st == ptype and sp.rpartition(".")[0] == parent.rpartition(".")[0]))]
        extra += max(twins, default=0) // 2
    return extra


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

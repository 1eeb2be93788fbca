"""quantization: frozen weight matrices stored in 4-bit."""

from __future__ import annotations

from memscope.analysis.suggestions.facts import ELEM, OPTIMIZER_SHARE, Facts, Suggestion, _b, _ndim

NF4_BYTES = 4.5 / 8  # 4-bit NF4 weights with one fp32 absmax per 64 weights (QLoRA, no double quant)


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

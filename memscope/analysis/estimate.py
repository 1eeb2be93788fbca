"""Training memory from numbers alone: the standard accounting, for planning without hardware.

Model states per parameter (bytes), as in the ZeRO paper (Rajbhandari et al., 2020):

* ``fp32``: weights 4, gradients 4, optimizer states 4 each (Adam: 2 states, 16 bytes/param:
  a 7B model needs 112 GB before activations).
* ``bf16`` / ``fp16``, mixed precision with fp32 master weights: weights 2, gradients 2, fp32
  master copy 4 plus states 4 each (Adam: 2 + 2 + 12 = 16 bytes/param).
* ``amp``, ``torch.autocast`` over fp32 weights: weights, gradients and states as fp32;
  activations 16-bit.
* ``pure-bf16``, the whole model and optimizer in bf16 (``model.to(torch.bfloat16)``):
  2 + 2 + 2 per state.

ZeRO stage 1 divides master weights and optimizer states by the world size, stage 2 the
gradients too, stage 3 (FSDP full sharding) the weights too.

Activations per transformer layer, from Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), without tensor or sequence parallelism:
``s*b*h*(34 + 5*a*s/h)`` bytes in 16-bit with dropout. Spelled out with ``e`` bytes per
activation element: ``s*b*h*(16*e + 2 masks)`` for the n x d tensors (attention 5e: qkv input,
q, k, v, projection input; MLP 9e: input, GELU input (4h), second linear input (4h); two layer
norm inputs 2e; two 1-byte dropout masks) and ``a*s*s*b*(e + 1 + e)`` for the scores (softmax
output, dropout mask, dropout output). Without dropout the masks and the dropout output go
(``32sbh + 2as²b`` in 16-bit); flash attention keeps a logsumexp instead of the scores
(``4*a*s*b``). Full checkpointing keeps each layer's input (``e*s*b*h`` per layer) plus one
layer recomputed during backward. The output layer adds the final norm and head inputs
(``2*e*s*b*h``) and, with a vocabulary, the fp32 log-softmax of the logits the loss saves
(``4*s*b*V``).

The total is the sum, an upper bound on the peak: gradients fill in as activations are freed
during backward, and allocator caching and the CUDA context (about 0.3-1 GB) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# precision: (weight bytes, gradient bytes, fp32 master bytes, bytes per optimizer state,
#             activation bytes)
PRECISIONS: dict[str, tuple[int, int, int, int, int]] = {
    "fp32": (4, 4, 0, 4, 4),
    "amp": (4, 4, 0, 4, 2),
    "bf16": (2, 2, 4, 4, 2),
    "fp16": (2, 2, 4, 4, 2),
    "pure-bf16": (2, 2, 0, 2, 2),
}
# optimizer: (states per parameter, fixed bytes per state or None for the precision's)
OPTIMIZERS: dict[str, tuple[int, int | None]] = {
    "adam": (2, None),
    "adamw": (2, None),
    "adam8bit": (2, 1),  # bitsandbytes block-wise 8-bit states
    "lion": (1, None),
    "sgd-momentum": (1, None),
    "sgd": (0, None),
    "adafactor": (0, None),  # factored second moment: O(rows + cols), no momentum by default
}


class EstimateError(ValueError):
    """Numbers that do not make an estimate (missing or inconsistent)."""


@dataclass
class Inputs:
    params: float | None = None
    optimizer: str = "adamw"
    precision: str = "fp32"
    batch: int | None = None  # micro-batch per GPU
    seq: int | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    vocab: int | None = None
    world_size: int = 1
    zero: int = 0  # 0: none, 1: optimizer states, 2: + gradients, 3: + weights (FSDP)
    checkpointing: bool = False
    flash_attention: bool = False
    dropout: bool = True


@dataclass
class Estimate:
    inputs: Inputs
    params: int
    bytes_per_param: dict[str, float]  # weights, gradients, optimizer_state (after sharding)
    components: dict[str, int | None]  # parameters, gradients, optimizer_state, activations
    activations_per_layer: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(v for v in self.components.values() if v is not None)

    @property
    def model_states(self) -> int:
        c = self.components
        return int(c["parameters"] or 0) + int(c["gradients"] or 0) + int(c["optimizer_state"] or 0)

    def as_json(self) -> dict[str, Any]:
        return {"schema": "memscope.estimate/1", "inputs": self.inputs.__dict__, "params": self.params,
                "bytes_per_param": self.bytes_per_param, "components": self.components,
                "activations_per_layer": self.activations_per_layer, "total_bytes": self.total,
                "notes": self.notes}


def param_count(layers: int, hidden: int, vocab: int | None = None, seq: int | None = None) -> int:
    """Parameters of a GPT-style decoder: 12*L*h^2 + 13*L*h (attention, 4h MLP, two norms, biases),
    token embeddings V*h, learned positions s*h when seq is given, final norm 2h."""
    return 12 * layers * hidden ** 2 + 13 * layers * hidden + (vocab or 0) * hidden \
        + (seq or 0) * hidden + 2 * hidden


def layer_activation_bytes(seq: int, batch: int, hidden: int, heads: int, elem: int,
                           dropout: bool = True, flash: bool = False) -> int:
    """Bytes one transformer layer saves for backward (Korthikanti et al., see the module doc)."""
    sbh = seq * batch * hidden
    linear = sbh * (16 * elem + (2 if dropout else 0))
    if flash:
        scores = 4 * heads * seq * batch  # fp32 logsumexp per row
    else:
        scores = heads * seq * seq * batch * (elem + ((1 + elem) if dropout else 0))
    return linear + scores


def estimate(i: Inputs) -> Estimate:
    if i.precision not in PRECISIONS:
        raise EstimateError(f"unknown precision {i.precision!r} (one of: {', '.join(PRECISIONS)})")
    if i.optimizer not in OPTIMIZERS:
        raise EstimateError(f"unknown optimizer {i.optimizer!r} (one of: {', '.join(OPTIMIZERS)})")
    if i.world_size < 1:
        raise EstimateError(f"--world-size must be at least 1, not {i.world_size}")
    if i.zero not in (0, 1, 2, 3):
        raise EstimateError(f"--zero must be 0, 1, 2 or 3, not {i.zero}")
    for name in ("batch", "seq", "layers", "hidden", "heads", "vocab"):
        v = getattr(i, name)
        if v is not None and v < 1:
            raise EstimateError(f"--{name} must be a positive integer, not {v}")
    notes: list[str] = []
    if i.params is not None:
        if i.params <= 0:
            raise EstimateError(f"--params must be positive, not {i.params:g}")
        params = int(round(i.params))
    elif i.layers and i.hidden:
        params = param_count(i.layers, i.hidden, i.vocab, i.seq)
        notes.append(f"parameters from the shape: 12Lh² + 13Lh + (V + s)h + 2h = {params:,}")
    else:
        raise EstimateError("give --params N, or --layers and --hidden (with --vocab) to count them")
    w_b, g_b, master_b, state_b, act_b = PRECISIONS[i.precision]
    states, fixed = OPTIMIZERS[i.optimizer]
    opt_b = master_b + states * (fixed if fixed is not None else state_b)
    if i.optimizer == "adafactor":
        notes.append("adafactor's factored state (rows + columns per matrix) is counted as 0")
    w = i.world_size
    if i.zero and w == 1:
        notes.append(f"ZeRO stage {i.zero} on one process shards nothing")
    per = {
        "weights": w_b / w if i.zero >= 3 else float(w_b),
        "gradients": g_b / w if i.zero >= 2 else float(g_b),
        "optimizer_state": opt_b / w if i.zero >= 1 else float(opt_b),
    }
    comps: dict[str, int | None] = {
        "parameters": int(round(params * per["weights"])),
        "gradients": int(round(params * per["gradients"])),
        "optimizer_state": int(round(params * per["optimizer_state"])),
        "activations": None,
    }
    per_layer = None
    shape = [i.batch, i.seq, i.layers, i.hidden]
    if i.batch is not None:
        if None in shape:
            raise EstimateError("activations need --batch, --seq, --layers and --hidden together")
        assert i.batch and i.seq and i.layers and i.hidden
        heads = i.heads
        if heads is None:
            heads = max(1, i.hidden // 128)
            notes.append(f"--heads not given: assumed {heads} (hidden / 128)")
        per_layer = layer_activation_bytes(i.seq, i.batch, i.hidden, heads, act_b, i.dropout,
                                           i.flash_attention)
        sbh = i.seq * i.batch * i.hidden
        output = 2 * act_b * sbh + (4 * i.seq * i.batch * i.vocab if i.vocab else 0)
        if i.checkpointing:
            acts = i.layers * act_b * sbh + per_layer + output
        else:
            acts = i.layers * per_layer + output
        comps["activations"] = acts
    else:
        # --seq alone counts the learned positions into the parameters (see param_count)
        notes.append("no activations: add --batch (with --seq, --layers and --hidden) for them")
    return Estimate(i, params, per, comps, per_layer, notes)

"""efficient_attention: fused attention kernels that never store the N x N scores."""

from __future__ import annotations

import re

from memscope.analysis.suggestions.facts import MIN_SHARE, Facts, Suggestion, _b, sdpa_kernels, transformers_model

_ATTENTION = re.compile(r"attn|attention", re.IGNORECASE)
_DROPOUT = re.compile(r"Dropout")


def efficient_attention(f: Facts) -> list[Suggestion]:
    """An attention module whose subtree (its own forward and its children's) saves more than
    its input, q, k, v and output saves the N x N scores (softmax output, masks).
    scaled_dot_product_attention keeps those five n x d tensors and a logsumexp per row, so the
    subtree is taken to need 5 x the module's output bytes after the change.

    On CPU, an attention module with dropout on its scores (a Dropout child whose output is
    larger than its parent's: the N x N probabilities, as in ng-video-lecture's ``Head``) is left
    out: the CPU flash kernel takes no dropout, so scaled_dot_product_attention runs its math
    kernel, which stores the scores again (measured on ng-video-lecture: 0.03 MiB saved of the
    6.5 MiB the scores take). On CUDA the memory-efficient kernel takes dropout. A transformers
    model on CPU is left out too: its attention is scaled_dot_product_attention already
    (``attn_implementation="sdpa"``, the default), and the scores it stores are the math
    kernel's (attention dropout, or masks the flash kernel refuses): the advice would change
    nothing (no whatif trial can measure this; the HF Trainer's GPT-2 was the case).

    A module the agent saw call scaled_dot_product_attention (its ``attention_kernels`` event:
    the backward node of what the kernel saved) is already on SDPA. With a fused kernel it
    stores no scores: nothing to suggest. With the math kernel on CPU (attention dropout, as
    nanoGPT's: measured 0 B saved by the switch) no CPU kernel would do better: not suggested.
    With the math kernel on CUDA a fused kernel refused the call: the scores are what it would
    not store, and the advice is to find why it refused."""
    cpu = not f.device.startswith("cuda")
    if cpu and transformers_model(f.layers) and not f.attention_kernels:
        return []  # a file without the kernel event: a transformers model is on SDPA already
    hits: list[tuple[str, str, int, int, int]] = []
    dropped: list[str] = []
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
            kernels = sdpa_kernels(f, name)
            if kernels and (cpu or not kernels & {"math"}) and not _torch_layer_attention(f, name, kind):
                dropped.append(name)  # on SDPA already: fused, or its math kernel on CPU
                continue
            if cpu and _score_dropout(f, name):
                dropped.append(name)
                continue
            hits.append((name, kind, saved, out, excess))
    saving = min(sum(h[4] for h in hits), f.activations)
    if not hits:
        return [] if dropped else _scores_at_failure(f)
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


def _score_dropout(f: Facts, name: str) -> bool:
    """Whether a Dropout under the attention module ``name`` drops the scores: it saved a mask
    (dropout is on) and its output is larger than its parent module's (N x N per head, not the
    n x d output a residual dropout keeps)."""
    out = {str(r["module"] or ""): int(r["output_bytes"] or 0) for r in f.layers}
    for r in f.layers:
        sub = str(r["module"] or "")
        if not sub.startswith(name + ".") or not _DROPOUT.search(str(r["type"] or "")):
            continue
        parent = sub.rsplit(".", 1)[0]
        if int(r["saved_bytes"] or 0) > 0 and int(r["output_bytes"] or 0) > out.get(parent, 0):
            return True
    return False


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


def _torch_layer_attention(f: Facts, name: str, kind: str) -> bool:
    """The nn.MultiheadAttention of torch's own Transformer layers: on SDPA already, with advice
    of its own (their dropout argument; see :func:`_attention_how`)."""
    parent = name.rsplit(".", 1)[0] if "." in name else ""
    types = {str(r["module"] or ""): str(r["type"] or "") for r in f.layers}
    return kind == "MultiheadAttention" and types.get(parent, "") in _TORCH_TRANSFORMER_LAYERS


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
    if names and all("math" in sdpa_kernels(f, n) for n in names):  # CUDA: a fused kernel refused it
        return (f"{', '.join(names[:4])} already call scaled_dot_product_attention, and it ran its "
                "math kernel, which stores the scores: find which fused kernel refuses the call "
                "with `with torch.nn.attention.sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):` around "
                "the forward (the error says why: a mask, a dtype, a head size)")
    how = ("replace the explicit `softmax(q @ k.transpose(-2, -1) / sqrt(d)) @ v` (and its mask) "
           "with `torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)` "
           "(or attn_mask=...): flash / memory-efficient kernels never store the N x N scores; "
           "nn.MultiheadAttention uses them only when called with need_weights=False")
    if cpu:
        how += ("; on CPU the flash kernel takes no dropout: with attention dropout (dropout_p > 0, "
                "or nn.MultiheadAttention's dropout) the math kernel runs and stores the scores again")
    return how

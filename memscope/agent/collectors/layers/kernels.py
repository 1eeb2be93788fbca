"""Which attention kernel a module's forward ran, read from the tensors autograd saves.

``F.scaled_dot_product_attention`` leaves a mark on what it saves for backward: its fused kernels
save their output with their own backward node (``ScaledDotProductFlashAttentionForCpuBackward0``
and the CUDA flash / efficient / cuDNN ones), and its math kernel (CPU with attention dropout, or
shapes and masks the fused kernels refuse) saves the N x N probabilities of ``_safe_softmax``
(``SafeSoftmaxBackward0``), where explicit attention's ``softmax`` saves ``SoftmaxBackward0``.
The saved-tensors pack hook already sees each of those tensors on a profiled step: reading its
``grad_fn``'s class name costs no hook of its own and nothing outside profiled steps.
"""

from __future__ import annotations

from typing import Any

# backward node class -> the kernel scaled_dot_product_attention ran
SDPA_NODES = {
    "SafeSoftmaxBackward0": "math",
    "ScaledDotProductFlashAttentionForCpuBackward0": "flash",
    "ScaledDotProductFlashAttentionBackward0": "flash",
    "ScaledDotProductEfficientAttentionBackward0": "efficient",
    "ScaledDotProductCudnnAttentionBackward0": "cudnn",
    "ScaledDotProductFusedAttentionOverrideableBackward0": "fused",
}


def sdpa_kernel(t: Any) -> str | None:
    """The SDPA kernel that made ``t`` (a tensor being saved for backward), or None."""
    node = t.grad_fn
    return SDPA_NODES.get(type(node).__name__) if node is not None else None

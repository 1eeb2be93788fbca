"""optimizer_offload: optimizer state in host memory."""

from __future__ import annotations

from memscope.analysis.suggestions.facts import OPTIMIZER_SHARE, Facts, Suggestion, _b

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

"""Which device each fake storage is on, and each device's live bytes and peak.

A script keeps some tensors on the CPU by design (ng-video-lecture's whole dataset, a
DataLoader's batches before ``.to(device)``): they are not GPU memory, and a GPU estimate that
counts them is wrong by their size. On a machine with a GPU a fake tensor knows its device. On
one without, memscope.agent.fake.fake_cuda keeps the script's "cuda" tensors on the CPU, so the
device is told from what the script asked: a storage made by a call that named a CUDA device
(``.cuda()``, ``.to("cuda")``, ``device="cuda"``) or by an op with a CUDA input is on the GPU;
``.cuda()`` of a CPU tensor (the same fake storage) moves it there. A tensor kept on both
devices (``gpu = cpu.cuda()`` with ``cpu`` still used) is one storage here and counts on the
GPU only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BLOCK = 512  # the CUDA caching allocator rounds every allocation up to a multiple of 512 bytes


def rounded(nbytes: int) -> int:
    """The block size the CUDA caching allocator gives an allocation of ``nbytes``."""
    return 0 if nbytes <= 0 else -(-nbytes // BLOCK) * BLOCK


@dataclass
class Counter:
    """One device's live tensor bytes, its peak in the run and in the current step."""

    total: int = 0
    total_rounded: int = 0
    peak: int = 0
    peak_rounded: int = 0
    step_peak: int = 0
    step_peak_rounded: int = 0
    pending: bool = False  # the peak rose since the last snapshot
    peak_live: list[int] = field(default_factory=list)  # serials live at the peak

    def grow(self, n: int) -> None:
        self.total += n
        self.total_rounded += rounded(n)
        if self.total > self.peak:
            self.peak = self.total
            self.pending = True
        self.step_peak = max(self.step_peak, self.total)
        self.peak_rounded = max(self.peak_rounded, self.total_rounded)
        self.step_peak_rounded = max(self.step_peak_rounded, self.total_rounded)

    def shrink(self, n: int, live: Any) -> None:
        """``n`` bytes freed; ``live()`` lists this device's serials before the release."""
        if self.pending:
            self.peak_live = list(live())
            self.pending = False
        self.total -= n
        self.total_rounded -= rounded(n)

    def close_step(self) -> dict[str, int]:
        out = {"peak_bytes": self.step_peak, "peak_rounded_bytes": self.step_peak_rounded}
        self.step_peak, self.step_peak_rounded = self.total, self.total_rounded
        return out


class Devices:
    """Per-device counters beside the ledger's all-device ones (see memscope.agent.fake.fake_ledger)."""

    def __init__(self) -> None:
        self.of: dict[int, str] = {}  # serial -> device type
        self.counters: dict[str, Counter] = {}
        self.target: str | None = None  # the device the torch call in progress named

    def counter(self, device: str) -> Counter:
        c = self.counters.get(device)
        if c is None:
            c = self.counters[device] = Counter()
        return c

    def add(self, serial: int, n: int, device: str) -> None:
        self.of[serial] = device
        self.counter(device).grow(n)

    def release(self, serial: int, n: int, live: dict[int, tuple[int, int]]) -> None:
        device = self.of.pop(serial, None)
        if device is None:
            return
        c = self.counter(device)
        c.shrink(n, lambda: [s for s, _ in live.values() if self.of.get(s) == device] + [serial])

    def move(self, serial: int, n: int, device: str, live: dict[int, tuple[int, int]]) -> None:
        """A storage now on ``device`` (``.cuda()`` of a CPU tensor on a pretend GPU)."""
        old = self.of.get(serial)
        if old is None or old == device:
            return
        self.release(serial, n, live)
        self.add(serial, n, device)

    def close_step(self) -> dict[str, dict[str, int]]:
        return {d: c.close_step() for d, c in sorted(self.counters.items())}

    def snapshot(self, device: str, live: dict[int, tuple[int, int]]) -> list[int]:
        """The serials live on ``device`` at its peak."""
        c = self.counter(device)
        if c.pending:
            return [s for s, _ in live.values() if self.of.get(s) == device]
        return c.peak_live

"""Run a training script for real on CPU as if the GPU held only CAP bytes of tensors.

    python tensor_cap.py CAP_BYTES SCRIPT.py [ARGS...]

Every tensor storage an op returns is counted from the start, rounded up to 512 bytes as the
CUDA caching allocator rounds its blocks, and subtracted when it dies (a weakref on the
storage): the exact count memscope's ``tensor_peak`` keeps, from the first tensor on. An op
that takes the count above CAP raises ``torch.OutOfMemoryError``, as the allocator of a GPU
that size would. Exit status: the script's, or 3 after an out-of-memory error. The last line
printed is ``peak <bytes>``.
"""

from __future__ import annotations

import os
import runpy
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class Cap(TorchDispatchMode):
    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap
        self.live: dict[int, int] = {}
        self.refs: dict[int, weakref.ref] = {}
        self.total = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.add(t)
        return out

    def add(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self.live:
            return
        n = st.nbytes()
        n = 0 if n <= 0 else -(-n // 512) * 512
        self.live[key] = n
        self.total += n
        self.peak = max(self.peak, self.total)

        def gone(ref: weakref.ref, key: int = key) -> None:
            if self.refs.get(key) is ref:
                del self.refs[key]
                self.total -= self.live.pop(key)

        self.refs[key] = weakref.ref(st, gone)
        if self.total > self.cap:
            raise torch.OutOfMemoryError(f"tensor cap: {self.total} bytes of tensors > cap {self.cap}")


def main() -> int:
    cap, script, *rest = sys.argv[1:]
    sys.argv = [script, *rest]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    mode = Cap(int(cap))
    code = 0
    try:
        with mode:
            runpy.run_path(script, run_name="__main__")
    except torch.OutOfMemoryError as exc:
        print(f"OOM: {exc}")
        code = 3
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    print(f"peak {mode.peak}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

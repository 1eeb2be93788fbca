"""Whether a module call runs inside a ``torch.utils.checkpoint`` region (profiled steps only).

What checkpointing keeps for backward is the checkpointed function's input, saved by
checkpoint's own machinery outside the function (non-reentrant: ``save_inputs`` before the
function runs; reentrant: ``CheckpointFunction``'s ``save_for_backward``, packed after its
forward returns). The layer profiler charges those bytes to the first module of the region that
receives them, so the checkpointed block's row shows what it keeps. A region is told by:

* non-reentrant (``use_reentrant=False``): the function runs under checkpoint's own
  saved-tensors hooks; the token is the id of that pack hook (one per checkpoint call);
* reentrant (``use_reentrant=True``): the function runs with grad disabled inside
  ``CheckpointFunction.forward``; the token is the id of that Python frame, found by a short walk
  up the call stack (only when a module is called with grad disabled under a counted caller).

Both only read: no hook is called, nothing is kept, nothing is imported (a script that never
imported ``torch.utils.checkpoint`` has no region).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

NON_REENTRANT = "n"
REENTRANT = "r"
_WALK = 12  # frames looked at above the module hook: __call__ machinery, a segment function


def non_reentrant_region() -> tuple[str, int] | None:
    """The region token when the innermost saved-tensors hooks are a non-reentrant checkpoint's."""
    try:
        hooks: Any = torch._C._autograd._top_saved_tensors_default_hooks(False)
    except Exception:
        return None
    if not hooks:
        return None
    pack = hooks[0]
    if (getattr(pack, "__module__", None) == "torch.utils.checkpoint"
            and "_checkpoint_hook" in getattr(pack, "__qualname__", "")):
        return NON_REENTRANT, id(pack)
    return None


def reentrant_region() -> tuple[str, int] | None:
    """The region token when ``CheckpointFunction.forward`` is a few frames up the call stack."""
    mod = sys.modules.get("torch.utils.checkpoint")
    forward = getattr(getattr(mod, "CheckpointFunction", None), "forward", None)
    code = getattr(forward, "__code__", None)
    if code is None:
        return None
    try:
        frame: Any = sys._getframe(2)
    except ValueError:
        return None
    for _ in range(_WALK):
        if frame is None:
            return None
        if frame.f_code is code:
            return REENTRANT, id(frame)
        frame = frame.f_back
    return None

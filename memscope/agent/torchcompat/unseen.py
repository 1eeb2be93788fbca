"""The agent's own tensor work, out of sight of the program's ``__torch_function__``.

A tensor subclass (or a ``TorchFunctionMode``) of the training script sees every torch call made
on its tensors, memscope's too: the agent's ``untyped_storage()``, ``grad_fn`` and shape reads
would show up in the program's counters and logs, and could change what it does. The places that
inspect the program's tensors (layer accounting hooks, the inventory scan, the OOM census, the
leak-site and technique hooks) run under ``torch._C.DisableTorchFunction``. Under Dynamo tracing
the hooks return at once (see memscope.agent.torchcompat.compiled), so the context is not entered there.
Put ``@unseen`` above ``@runtime_only``: runtime_only must see the function's own code.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, TypeVar

import torch

from memscope.agent.torchcompat.compiled import is_compiling, runtime_only

F = TypeVar("F", bound=Callable[..., Any])

_DISABLE: Callable[[], Any] = (getattr(torch._C, "DisableTorchFunction", None)
                               or getattr(torch._C, "DisableTorchFunctionSubclass", None)
                               or contextlib.nullcontext)


def unseen(fn: F) -> F:
    """``fn`` runs with ``__torch_function__`` dispatch off (subclasses and modes alike)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if is_compiling():
            return fn(*args, **kwargs)
        with _DISABLE():
            return fn(*args, **kwargs)
    return runtime_only(wrapper)  # type: ignore[return-value]  # Dynamo skips the wrapper too

"""Backward time per module (``backward_s``), without global full backward hooks.

Those hooks wrap every module's inputs and outputs in ``BackwardHookFunction`` and change the
graph. Instead, at forward-post of a counted call, a pre-hook goes on the ``grad_fn`` of each
output tensor (the gradient for the module's output has arrived: its backward starts) and on the
``grad_fn`` of each input tensor (the gradient for its input is ready: its backward is over).
When no input has a ``grad_fn`` (the first layer, data inputs), the end is the end of that
backward pass (an autograd engine callback queued from the start hook). So ``backward_s`` covers
the module's children, like ``forward_s``, and autograd work interleaved in that window (another
branch scheduled between them) too. Hooks sit on graph nodes, hold no tensor or node, and their
handles are removed at the end of the step; a backward that runs after that (a graph kept across
steps) is not timed.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from memscope.agent.collectors.layers.stats import ModuleStats
from memscope.agent.collectors.layers.tensors import grad_fns
from memscope.agent.torchcompat.compiled import runtime_only
from memscope.agent.torchcompat.unseen import unseen
from memscope.agent.torchcompat.handles import remove_quietly

MAX_BACKWARD_HOOKS = 100_000  # node hooks per profiled step; calls beyond it are not timed


class BackwardTimer:
    """Times the backward of the calls :meth:`hook` is given. ``active`` says whether the step
    is still profiled; ``on_backward`` hears that a backward ran (a micro-batch boundary)."""

    def __init__(self, active: Callable[[], bool], on_backward: Callable[[], None]) -> None:
        self._active = active
        self._on_backward = on_backward
        self._calls: list[list[Any]] = []  # per counted call [stats, start, end, ends with pass]
        self._handles: list[Any] = []
        self._nodes: dict[Any, tuple[list[Any], list[Any]]] = {}  # (thread, seq nr) -> calls

    def reset(self) -> None:
        self._calls = []
        self._handles = []
        self._nodes = {}

    def remove(self) -> None:
        """Remove the node hooks (on graph nodes: a graph kept past the step loses them)."""
        remove_quietly(self._handles)
        self._handles = []
        self._nodes = {}

    def add_times(self) -> None:
        """Add each timed call's backward time to its module's stats."""
        for st, start, end, _ in self._calls:
            if start is not None and end is not None and end >= start:
                st.backward_s = (st.backward_s or 0.0) + (end - start)
        self._calls = []

    @unseen
    def hook(self, st: ModuleStats, args: Any, output: Any) -> None:
        """Pre-hooks on the grad_fns of the call's outputs (its backward starts) and inputs (it
        ends). One hook per node and step, shared by every call that starts or ends there (a
        module's output node is the next one's input node). Only the nodes in hand are
        touched; nothing keeps them."""
        outs = grad_fns(output)
        if not outs:
            return
        ins = grad_fns(args)
        in_ids = {id(n) for n in ins}
        outs = [n for n in outs if id(n) not in in_ids]  # an identity module: nothing of its own
        if not outs or len(self._handles) > MAX_BACKWARD_HOOKS:
            return
        call: list[Any] = [st, None, None, not ins]  # stats, start, end, ends with the pass
        self._calls.append(call)
        for n in outs:
            self._node_calls(n)[0].append(call)
        for n in ins:
            self._node_calls(n)[1].append(call)

    @runtime_only
    def _node_calls(self, node: Any) -> tuple[list[Any], list[Any]]:
        """The (starting, ending) calls of a graph node, hooking it on first sight. Nodes are
        keyed by their sequence number (unique per thread), never by a kept reference."""
        try:
            key: Any = (threading.get_ident(), node._sequence_nr())
        except Exception:
            key = None
        entry = self._nodes.get(key) if key is not None else None
        if entry is None:
            entry = ([], [])
            starts, ends = entry

            def fire(_grads: Any) -> None:
                if not self._active():
                    return
                self._on_backward()
                t = time.perf_counter()
                for c in ends:
                    if c[1] is not None and c[2] is None:
                        c[2] = t
                for c in starts:
                    if c[1] is None:
                        c[1] = t
                        if c[3]:  # nothing marks its end but the end of this backward pass
                            self._end_with_pass(c)

            self._handles.append(node.register_prehook(fire))
            if key is not None:
                self._nodes[key] = entry
        return entry

    @runtime_only
    def _end_with_pass(self, call: list[Any]) -> None:
        def ended() -> None:
            if call[2] is None and self._active():
                call[2] = time.perf_counter()
        try:
            torch.autograd.Variable._execution_engine.queue_callback(ended)
        except Exception:
            pass

"""The selective-checkpointing profile of a plain run (the ``block_profile`` option, on by
default): ONE forward of ONE block instance, on one step after warm-up, recorded op by op by
:class:`memscope.agent.whatif.sac_profile.BlockProfile`, so that ``report`` can suggest
``selective_checkpointing`` without a whatif run.

Nothing is patched and nothing global is installed. At the step boundary before the chosen
step, the first block of the largest repeated container (``choose_blocks``) gets a forward
pre-hook and an ``always_call`` forward hook of its own; the pre-hook starts the recording (the
dispatch mode, the pack hook, hooks on the block's submodules) for the first call that may be
profiled, the forward hook ends it and removes every hook. A step in which the block never ran
in a profiled way loses its hooks at the step's close and the next eligible step is tried, a few
times at most. Calls not profiled, and why (an event says so when no call could be):

* under ``torch.compile`` (the model or a block compiled, or Dynamo compiled anything in the
  process: a compiled region would trace or guard on the hooks), or while Dynamo traces;
* while a dispatch mode of the script's (not memscope's) is active: it would see the profile's
  mode, and it ours;
* inside saved-tensor hooks (a non-reentrant checkpoint region, the script's offloading hooks:
  the profile's pack hook would take their place) or inside backward (a reentrant checkpoint's
  recomputation);
* under ``no_grad`` / ``inference_mode`` (evaluation): nothing is saved for backward there.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from memscope.agent.torchcompat.compiled import compile_used, is_compiling, runtime_only, shield
from memscope.agent.torchcompat.handles import remove_quietly

TRIES = 3  # steps armed at most before giving up on a block that never ran in a profiled way

# why a call was not profiled; True: every later call would be refused as well (give up now)
_FINAL = {"compiled": True, "dispatch_mode": True, "saved_hooks": True, "backward": True,
          "no_grad": False, "raised": False}


class OnceProfile:
    """The agent calls :meth:`step_closed` at each step boundary and :meth:`stop` at its end.
    ``event(kind, message, data)`` writes an event row."""

    def __init__(self, event: Callable[[str, str, Any], None]) -> None:
        self._event = event
        self.done = False  # recorded, or given up (an event says which)
        self.tries = 0
        self.armed_for: int | None = None
        self._handles: list[Any] = []
        self._why: dict[str, str] = {}  # reason -> its words, in the order first seen
        self._block: Any = None
        self._where: dict[str, Any] = {}
        self._profile: Any = None
        self._thread = 0
        self._depth = 0  # the block called again from its own forward while recording
        self._cpu = 0.0
        self._new: Any = None  # BlockProfile, imported when armed (not inside the user's forward)
        shield.add(self._hook_handles)  # out of Dynamo's sight should it compile while armed

    def _hook_handles(self) -> list[Any]:
        inner = self._profile._handles if self._profile is not None else []
        return [*self._handles, *inner]

    # -- at step boundaries (training thread) --------------------------------------------------

    def step_closed(self, step: int, roots: list[Any], next_profiles_layers: bool,
                    roots_to_come: bool) -> None:
        """``step`` has closed. ``roots``: the models seen so far; ``next_profiles_layers``: the
        layer profiler runs in ``step + 1`` (its saved-tensor hooks would not see the block's);
        ``roots_to_come``: a later layer-profiled step may still find the models."""
        if self.done:
            return
        if self.armed_for is not None:
            self._disarm()
            if self.done:
                return
            if self.tries >= TRIES:
                self._give_up()
                return
        if compile_used():  # before the models: a compiled one may never be seen by the layer profiler
            self._skip("compiled", "torch.compile compiled code in this process")
            return
        if next_profiles_layers:
            return
        if not roots:
            if not roots_to_come:
                self._skip("no_model", "no model was seen (per-layer profiling finds it: it is off, "
                                       "or no module with parameters ran under grad mode)")
            return
        self._arm(step + 1, roots)

    def _arm(self, step: int, roots: list[Any]) -> None:
        from memscope.agent.whatif.sac_apply import _compiled
        from memscope.agent.whatif.sac_profile import BlockProfile
        from memscope.agent.whatif.techniques import choose_blocks

        best: tuple[int, Any, str, list[Any]] | None = None
        for root in roots:
            name, blocks = choose_blocks(root)
            if blocks:
                size = sum(p.numel() for b in blocks for p in b.parameters())
                if best is None or size > best[0]:
                    best = (size, root, name, blocks)
        if best is None:
            self._skip("no_blocks", "no repeated blocks (a ModuleList / Sequential of same-type modules)")
            return
        _, root, container, blocks = best
        why = _compiled(root, blocks)
        if why:
            self._skip("compiled", why)
            return
        first = blocks[0]
        self._new = BlockProfile
        self._block = first
        self._where = {"container": container, "block_type": type(first).__name__, "blocks": len(blocks)}
        self._handles = [
            first.register_forward_pre_hook(self._pre, with_kwargs=True),
            first.register_forward_hook(self._post, prepend=True, always_call=True),
        ]
        self.armed_for = step
        self.tries += 1

    def _disarm(self) -> None:
        """At the close of the armed step: whatever is still installed goes."""
        if self._profile is not None and self._thread == threading.get_ident():
            self._end(ok=False)  # a forward left mid-way (its forward hook never ran)
        self._remove()
        self.armed_for = None
        if any(_FINAL.get(k) for k in self._why):
            self._give_up()

    def stop(self) -> None:
        """At agent stop: nothing of the profile stays installed."""
        if self._profile is not None and self._thread == threading.get_ident():
            self._end(ok=False)
        self._remove()
        self.armed_for = None

    def _remove(self) -> None:
        remove_quietly(self._handles)
        self._handles = []
        self._block = None

    def _give_up(self) -> None:
        why = "; ".join(self._why.values()) or "the block's forward did not run in the steps tried"
        final = [k for k in self._why if _FINAL.get(k)]
        self._skip(final[0] if final else next(iter(self._why), "not_called"), why)

    def _skip(self, reason: str, why: str) -> None:
        self.done = True
        self._remove()
        self._event("sac_profile_skipped", f"selective-checkpointing profile not taken: {why}",
                    {"reason": reason, "why": why, **self._where})

    # -- the block's hooks (training thread, inside the user's forward) ------------------------

    def _refused(self) -> tuple[str, str] | None:
        if is_compiling() or compile_used():
            return "compiled", "torch.compile compiled code in this process"
        if not torch.is_grad_enabled():
            return "no_grad", "the block ran only under no_grad / inference_mode (evaluation)"
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        user = [type(m).__name__ for m in _get_current_dispatch_mode_stack()
                if not type(m).__module__.startswith("memscope.")]
        if user:
            return "dispatch_mode", f"a dispatch mode of the script is active ({', '.join(user)})"
        if torch._C._autograd._top_saved_tensors_default_hooks(False):
            return "saved_hooks", ("the block runs under saved-tensor hooks (torch.utils.checkpoint, "
                                   "or the script's own): the profile's pack hook would take their place")
        if torch._C._current_graph_task_id() != -1:
            return "backward", "the block runs inside backward (a reentrant checkpoint's recomputation)"
        return None

    @runtime_only
    def _pre(self, module: Any, args: Any, kwargs: Any) -> None:
        try:
            if self._profile is not None:
                self._depth += 1
                return
            if module is not self._block or self.armed_for is None:
                return
            refused = self._refused()
            if refused is not None:
                self._why.setdefault(*refused)
                return
            self._cpu = time.thread_time()
            self._thread = threading.get_ident()
            profile = self._new()
            profile.begin(module, args, kwargs)
            self._profile = profile
            self._depth = 0
        except Exception as exc:
            self._why.setdefault("raised", f"{type(exc).__name__}: {exc}")

    @runtime_only
    def _post(self, module: Any, args: Any, output: Any) -> None:
        try:
            if self._profile is None or self._thread != threading.get_ident():
                return
            if self._depth:
                self._depth -= 1
                return
            # None: maybe the forward raised (always_call hooks run then too): the hooks stay
            # inert until the step's close, for torch is going through this very dict then
            self._end(ok=output is not None)
        except Exception as exc:
            self._why.setdefault("raised", f"{type(exc).__name__}: {exc}")

    def _end(self, ok: bool) -> None:
        profile, self._profile = self._profile, None
        profile.end()
        if not ok:
            self._why.setdefault("raised", "the profiled forward did not return")
            return
        cpu = time.thread_time() - self._cpu
        step, self.armed_for = self.armed_for, None
        self.done = True
        self._remove()
        data = {**self._where, **profile.as_json(), "step": step, "cpu_s": round(cpu, 6)}
        self._event("sac_profile", f"{self._where['block_type']} {self._where['container']}.0: "
                                   f"{len(profile.ops)} ops (one forward profiled, {cpu * 1e3:.1f} ms CPU)", data)

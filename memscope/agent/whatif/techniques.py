"""What ``memscope whatif`` needs inside the training process: memory-saving techniques applied
to an unchanged script (``--try``), the exact per-step peak of live tensor bytes that measures
them on CPU (:class:`memscope.agent.collectors.tensor_peak.TensorPeak`, on every step here),
the step limit that ends a trial (``--max-steps``), and the ``--simulate-gpu`` cap
(memscope.agent.whatif.simulate). :class:`Controller` is the agent's one entry.

* ``lighter_optimizer``: the optimizers that keep two states per parameter (``torch.optim.Adam``,
  ``AdamW``, ``Adadelta`` (pytorch/examples' mnist), ``Adamax``, ``NAdam``, ``RAdam``) are
  replaced, at agent start (right after ``import torch``, before the script builds anything), by
  a subclass of ``torch.optim.SGD(momentum=0.9)`` that takes the same arguments: one state
  tensor per parameter instead of two, what the ``lighter_optimizer`` suggestion proposes for
  each of them.
* ``mixed_precision``: the root module's forward runs under
  ``torch.autocast(device_type, dtype=torch.bfloat16)`` (device of its first parameter), and so
  does every other model the first two steps call outside it (a GAN's discriminator beside its
  generator). A loss computed outside the forward stays as the script has it, but for
  ``binary_cross_entropy`` (``nn.BCELoss``), which gets a bfloat16 input in float32, as the
  advice tells such a script to do.
* ``activation_checkpointing``: the forward of each repeated block (the children of the
  ModuleList / Sequential of same-type non-leaf modules with the most parameters, a proxy for
  the most activation bytes: nothing is measured before the first forward) runs under
  ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``. Without such blocks, a
  Sequential is checkpointed with ``checkpoint_sequential``: the one and the segment count the
  estimator chose from the baseline (the ``checkpoint_plan`` option, set by ``memscope whatif``),
  else the longest in sqrt(n) segments.

The root is found lazily: a global forward pre-hook waits for the first module with parameters
called under grad mode (the outermost module's pre-hook fires before any inner one's), then
removes itself. Forwards are patched on the *class* and act only on the chosen instances
(a WeakSet): an instance attribute or a hook stored on the user's model would travel with a
``torch.save(model)`` pickle. The class attribute is looked up before the pre-hook runs, so the
root's own first call is wrapped by entering autocast in that pre-hook and leaving it in a
one-shot forward hook; blocks inside the root are patched before their first call. A root that
is itself the checkpointed Sequential is checkpointed from its second call on.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.nn.modules import module as _nn_module

from memscope.agent.collectors.tensor_peak import TensorPeak

if TYPE_CHECKING:
    from memscope.agent.collectors.host import CollectorHost


class Controller:
    """What the agent calls for these options: ``install`` at start, ``step_closed`` at each
    step boundary (after the step's rows are queued)."""

    def __init__(self, agent: "CollectorHost") -> None:
        self.agent = agent
        self.peak = TensorPeak(phase=lambda: agent.phase) if agent.options.tensor_peak else None
        self.peak_failed = False

    def install(self) -> None:
        install(self.agent, self.peak)

    def stop(self) -> None:
        """At agent stop: leave the tensor-peak dispatch mode (a step cut short is not written)."""
        if self.peak is not None and self.peak.active:
            try:
                self.peak.end()
            except Exception:
                pass

    def step_closed(self, step: int) -> None:
        agent = self.agent
        if self.peak is not None and not self.peak_failed:
            try:
                if self.peak.step == step:
                    uncounted = self.peak.uncounted
                    peak, start = self.peak.end()
                    missed = f" ({uncounted} tensor(s) without a storage not counted)" if uncounted else ""
                    grads = self.peak.grads_at_peak
                    agent.event("tensor_peak", f"step {step}: live tensor bytes peaked at {peak}{missed}",
                                {"step": step, "peak_bytes": peak, "start_bytes": start,
                                 "start_grad_bytes_at_peak": grads, "uncounted_tensors": uncounted,
                                 "phase": self.peak.phase_at_peak, "phases": self.peak.phases()})
                if not (agent.options.max_steps and step + 1 >= agent.options.max_steps):
                    self.peak.begin(step + 1)
            except Exception as exc:
                self.peak_failed = True
                try:
                    self.peak.end()
                except Exception:
                    pass
                agent.event("collector_disabled", f"tensor_peak: {type(exc).__name__}: {exc}")
        if agent.options.max_steps and step + 1 >= agent.options.max_steps:
            end_at_max_steps(agent, step + 1)


def install(agent: "CollectorHost", peak: "TensorPeak | None" = None) -> None:
    """Apply ``agent.options.try_techniques`` and ``simulate_gpu``. Called once at agent start."""
    opts = agent.options
    if opts.simulate_gpu:
        from memscope.agent.whatif.simulate import install as simulate

        simulate(agent, opts.simulate_gpu)
    chosen = list(dict.fromkeys(opts.try_techniques))
    if "lighter_optimizer" in chosen:
        _swap_adam(agent)
    model_level = [t for t in chosen if t in ("mixed_precision", "activation_checkpointing",
                                              "selective_checkpointing")]
    if opts.sac_profile:
        model_level.append("sac_profile")
    if model_level:
        _RootWatcher(agent, model_level, peak).install()


def end_at_max_steps(agent: "CollectorHost", done: int) -> None:
    """At the boundary that completed step ``done - 1``: record why, flush, end the process.

    ``SystemExit(0)`` raised from the step hook unwinds the user's loop like a ``sys.exit(0)``
    at that line: ``finally`` blocks and ``with`` exits run, ``except Exception`` does not catch
    it, and the exit status is 0. ``os._exit`` would skip the script's clean-up and lose buffered
    output. The agent is stopped first (hooks removed, rows flushed, process row written), so a
    script that swallows SystemExit goes on unrecorded rather than half recorded. In a thread
    other than the main one, SystemExit ends only that thread (documented limit)."""
    agent.event("max_steps", f"run ended on purpose after {done} step(s) (--max-steps {done})",
                {"max_steps": agent.options.max_steps, "steps": done})
    agent.stop()
    raise SystemExit(0)


# -- lighter_optimizer -----------------------------------------------------------------------------


# torch.optim's optimizers with two states per parameter, and their default learning rates
TWO_STATES = {"Adam": 1e-3, "AdamW": 1e-3, "Adadelta": 1.0, "Adamax": 2e-3, "NAdam": 2e-3, "RAdam": 1e-3}


def _swap_adam(agent: "CollectorHost") -> None:
    optim = torch.optim

    def make(name: str, default_lr: float) -> type:
        def __init__(self: Any, params: Any, lr: Any = default_lr, *args: Any, **kwargs: Any) -> None:
            torch.optim.SGD.__init__(self, params, lr=lr, momentum=0.9)
            agent.event("technique", f"lighter_optimizer: {name}(...) built as SGD(momentum=0.9)",
                        {"technique": "lighter_optimizer", "applied": True, "replaced": name})

        # a real subclass: isinstance(opt, Optimizer) and LR schedulers keep working
        return type(f"{name}AsSGD", (torch.optim.SGD,), {"__init__": __init__, "__module__": __name__})

    for name, lr in TWO_STATES.items():
        if isinstance(getattr(optim, name, None), type):
            setattr(optim, name, make(name, lr))


# -- model-level techniques ------------------------------------------------------------------------


class _RootWatcher:
    def __init__(self, agent: "CollectorHost", techniques: list[str], peak: "TensorPeak | None" = None) -> None:
        self.agent = agent
        self.peak = peak
        self.techniques = techniques
        self.handle: Any = None
        self.done = False
        self.lock = threading.Lock()
        self.more: Any = None  # the hook that finds the other models of the step (mixed_precision)
        self.roots: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def install(self) -> None:
        self.handle = _nn_module.register_module_forward_pre_hook(self._pre)

    def _another(self, module: Any, args: Any) -> None:
        """mixed_precision on every model of the step, not the first alone: a GAN's discriminator
        runs its own forward beside the generator's (what the advice's autocast around the
        forward passes covers). A module with parameters called outside autocast under grad
        mode is another model; inside a model's forward autocast is on already. Watched while
        the first two steps run (every model of a step is called by then)."""
        try:
            if not torch.is_grad_enabled() or module in self.roots:
                return
            if self.agent.current_step >= 2:
                self._stop_more()
                return
            param = next(module.parameters(), None)
            if param is None or torch.is_autocast_enabled(param.device.type if param.device.type in ("cpu", "cuda")
                                                         else "cpu"):
                return
        except Exception:
            return
        self.roots.add(module)
        try:
            self._mixed_precision(module)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            self.agent.event("technique", f"mixed_precision: not applied to {type(module).__name__}: {why}",
                             {"technique": "mixed_precision", "applied": False, "why": why})

    def _stop_more(self) -> None:
        handle, self.more = self.more, None
        if handle is not None:
            try:
                handle.remove()
            except Exception:
                pass

    def _pre(self, module: Any, args: Any) -> None:
        if self.done or not torch.is_grad_enabled():
            return
        try:
            if next(module.parameters(), None) is None:
                return  # a parameter-free module (a loss, a wrapper) is not the model
        except Exception:
            return
        with self.lock:
            if self.done:
                return
            self.done = True
        try:
            self.handle.remove()
        except Exception:
            pass
        for technique in self.techniques:
            try:
                if technique == "mixed_precision":
                    self.roots.add(module)
                    self._mixed_precision(module)
                    _bce_in_float(self.agent)
                    self.more = _nn_module.register_module_forward_pre_hook(self._another)
                elif technique in ("selective_checkpointing", "sac_profile"):
                    from memscope.agent.whatif import sac_apply

                    sac_apply.apply(self.agent, module, technique, _patch_class_forward, self.peak)
                else:
                    self._checkpointing(module)
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
                self.agent.event("technique", f"{technique}: not applied: {why}",
                                 {"technique": technique, "applied": False, "why": why})

    def _mixed_precision(self, root: Any) -> None:
        param = next(root.parameters())
        sizes: dict[bool, int] = {True: 0, False: 0}
        for p in root.parameters():
            sizes[p.dtype == torch.float64] += p.numel() * p.element_size()
        if sizes[True] > sizes[False]:  # autocast casts only float32: it would change nothing
            why = ("the model's parameters are float64, which autocast leaves alone "
                   "(single_precision: float32 first)")
            self.agent.event("technique", f"mixed_precision: not applied: {why}",
                             {"technique": "mixed_precision", "applied": False, "why": why})
            return
        device = param.device.type if param.device.type in ("cpu", "cuda") else "cpu"
        dtype = torch.bfloat16

        def wrap(orig: Callable[..., Any], module: Any, args: Any, kwargs: Any) -> Any:
            with torch.autocast(device, dtype=dtype):
                return orig(module, *args, **kwargs)

        _patch_class_forward(type(root), "mixed_precision", root, wrap)
        # this very call already looked its forward up: autocast from here to its forward hook
        ctx = torch.autocast(device, dtype=dtype)
        ctx.__enter__()
        box: list[Any] = []

        def leave(module: Any, args: Any, output: Any) -> None:
            if module is not root:
                return
            try:
                ctx.__exit__(None, None, None)
            finally:
                box[0].remove()

        try:
            box.append(_nn_module.register_module_forward_hook(leave, always_call=True))
        except TypeError:
            box.append(_nn_module.register_module_forward_hook(leave))
        self.agent.event("technique", f"mixed_precision: {type(root).__name__}.forward under "
                                      f"torch.autocast({device!r}, bfloat16)",
                         {"technique": "mixed_precision", "applied": True, "device": device})

    def _checkpointing(self, root: Any) -> None:
        # the estimator's plan comes first
        seq_name, seq, segments = planned_sequential(root, self.agent.options.checkpoint_plan)
        container, blocks = ("", []) if seq is not None else choose_blocks(root)
        if blocks:
            def wrap(orig: Callable[..., Any], module: Any, args: Any, kwargs: Any) -> Any:
                if not torch.is_grad_enabled():
                    return orig(module, *args, **kwargs)
                return torch.utils.checkpoint.checkpoint(functools.partial(orig, module), *args,
                                                         use_reentrant=False, **kwargs)

            for b in blocks:
                _patch_class_forward(type(b), "activation_checkpointing", b, wrap)
            names = f"{container}[0..{len(blocks) - 1}]"
            self.agent.event("technique", f"activation_checkpointing: {len(blocks)} "
                                          f"{type(blocks[0]).__name__} blocks {names}",
                             {"technique": "activation_checkpointing", "applied": True,
                              "container": container, "blocks": len(blocks)})
            return
        if seq is None:
            seq_name, seq = longest_sequential(root)
            segments = max(2, math.isqrt(len(seq))) if seq is not None else 0
        if seq is None:
            self.agent.event("technique", "activation_checkpointing: not applied: no repeated "
                                          "blocks and no Sequential to checkpoint",
                             {"technique": "activation_checkpointing", "applied": False})
            return

        def wrap_seq(orig: Callable[..., Any], module: Any, args: Any, kwargs: Any) -> Any:
            if not torch.is_grad_enabled() or len(args) != 1 or kwargs:
                return orig(module, *args, **kwargs)
            return torch.utils.checkpoint.checkpoint_sequential(module, segments, args[0],
                                                                use_reentrant=False)

        _patch_class_forward(type(seq), "activation_checkpointing", seq, wrap_seq)
        self.agent.event("technique", f"activation_checkpointing: Sequential {seq_name or '<root>'} "
                                      f"of {len(seq)} layers in {segments} segments",
                         {"technique": "activation_checkpointing", "applied": True,
                          "container": seq_name, "segments": segments,
                          "first_call_unpatched": seq is root})


def choose_blocks(root: Any) -> tuple[str, list[Any]]:
    """The repeated blocks: children of the ModuleList / Sequential whose children (two or
    more) are all of one type with submodules of their own, the one with the most parameters."""
    best: tuple[int, str, list[Any]] | None = None
    for name, m in root.named_modules():
        if not isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        kids = list(m.children())
        if len(kids) < 2 or len({type(k) for k in kids}) != 1:
            continue
        if next(kids[0].children(), None) is None:
            continue  # leaves: checkpointing one layer alone saves nothing
        size = sum(p.numel() for p in m.parameters())
        if best is None or size > best[0]:
            best = (size, name, kids)
    return (best[1], best[2]) if best else ("", [])


def planned_sequential(root: Any, plan: dict[str, Any] | None) -> tuple[str, Any, int]:
    """The Sequential and segment count the estimator chose for this model (``memscope whatif``
    passes them as the ``checkpoint_plan`` option), so that the trial measures the plan the
    suggestion describes; ``("", None, 0)`` without one or when it does not name a Sequential of
    this model (or one too short for that many segments)."""
    if plan is None:
        return "", None, 0
    name, segments = plan["container"], plan["segments"]  # validated by AgentOptions
    seq = dict(root.named_modules()).get(name)
    if isinstance(seq, torch.nn.Sequential) and segments <= len(seq):
        return name, seq, segments
    return "", None, 0


def longest_sequential(root: Any) -> tuple[str, Any]:
    best: tuple[str, Any] = ("", None)
    for name, m in root.named_modules():
        if isinstance(m, torch.nn.Sequential) and len(m) >= 3 and (best[1] is None or len(m) > len(best[1])):
            best = (name, m)
    return best


_registries: dict[tuple[type, str], "weakref.WeakSet[Any]"] = {}


def _bce_in_float(agent: "CollectorHost") -> None:
    """What the mixed_precision advice tells a script with ``nn.BCELoss`` to do (``output.float()``
    before the loss, or BCEWithLogitsLoss): a bfloat16 input to binary_cross_entropy is cast to
    float32, outside autocast (which refuses the op). Without it the trial of pytorch/examples'
    dcgan stopped at its first loss (the discriminator's Sigmoid output in bfloat16)."""
    fn = torch.nn.functional
    orig = fn.binary_cross_entropy
    if getattr(orig, "_memscope_float", False):
        return

    said: list[bool] = []

    @functools.wraps(orig)
    def binary_cross_entropy(input: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(input, torch.Tensor) and input.dtype in (torch.bfloat16, torch.float16):
            if not said:
                said.append(True)
                agent.event("technique", "mixed_precision: binary_cross_entropy (nn.BCELoss) computed in float32 "
                                         "from a bfloat16 input, as the advice says (output.float())",
                            {"technique": "mixed_precision", "applied": True, "bce_float": True})
            device = input.device.type if input.device.type in ("cpu", "cuda") else "cpu"
            with torch.autocast(device, enabled=False):
                target = target.float() if isinstance(target, torch.Tensor) and target.is_floating_point() else target
                return orig(input.float(), target, *args, **kwargs)
        return orig(input, target, *args, **kwargs)

    binary_cross_entropy._memscope_float = True  # type: ignore[attr-defined]
    fn.binary_cross_entropy = binary_cross_entropy


def _patch_class_forward(cls: type, technique: str, instance: Any,
                         wrap: Callable[[Callable[..., Any], Any, Any, Any], Any]) -> None:
    """Route ``instance``'s forward through ``wrap``; other instances of ``cls`` are untouched."""
    key = (cls, technique)
    chosen = _registries.get(key)
    if chosen is None:
        chosen = _registries[key] = weakref.WeakSet()
        orig = cls.forward  # type: ignore[attr-defined]

        @functools.wraps(orig)
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self in chosen:
                return wrap(orig, self, args, kwargs)
            return orig(self, *args, **kwargs)

        cls.forward = forward  # type: ignore[attr-defined]
    chosen.add(instance)

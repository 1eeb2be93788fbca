"""Agent options: from keyword arguments (``memscope.start``) or the environment (``attach``)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from memscope.redact import check_pattern
from memscope.units import parse_size

ENV_DB = "MEMSCOPE_DB"
ENV_OPTIONS = "MEMSCOPE_OPTIONS"  # JSON object of AgentOptions fields
ENV_SKIP_CHILD_OF = "MEMSCOPE_SKIP_CHILD_OF"  # pid of a launcher's parent: its direct child is a launcher
ENV_SUPERVISOR = "MEMSCOPE_SUPERVISOR"  # pid of attach's supervisor: the agent ends its process when it dies
ENV_DB_ID = "MEMSCOPE_DB_ID"  # "st_dev:st_ino" of the run file attach created: a replaced file is noticed
ENV_PATH = "MEMSCOPE_PATH"  # where the memscope package lives, for a Python that cannot import it
# the event a process under attach writes when its import torch failed (agent/runtime/torch_missing.py)
EVENT_TORCH_MISSING = "torch_missing"
# Techniques the agent can apply to an unchanged script (memscope/agent/whatif/techniques.py)
TECHNIQUES = ("mixed_precision", "activation_checkpointing", "lighter_optimizer", "selective_checkpointing")


@dataclass
class AgentOptions:
    sample_hz: float = 20.0
    nvml_interval: float = 1.0  # seconds; NVML is slow and takes a driver lock
    nvml: bool = True
    queue_size: int = 20000
    flush_interval: float = 0.25
    layers_every: int = 50  # per-layer profiling every N steps (0: never)
    layers_first: int = 1  # the first profiled step
    # Tensor inventories (leak detection), at most every N steps (0: never). With a budget (the
    # default) the cadence is automatic: every N steps at first, thinning out as the run goes,
    # pulled forward when memory rises (memscope/agent/collectors/inventory/schedule.py).
    inventory_every: int = 1
    # Share of the training time inventories may take (beyond a small allowance for the first
    # steps). 0: exactly every ``inventory_every`` steps; naming ``inventory_every`` without a
    # budget means that, too.
    inventory_budget: float = 0.01
    # Forward OOMs the script catches itself (batch-size finders) are seen by default in step 0,
    # on profiled steps and on steps after one that used a quarter of the memory limit (global
    # hooks, armed only then: memscope.agent.collectors.oom_hooks). This option adds a forward hook on each
    # root model for every step. Off by default: a hook stored on the user's model travels with
    # it (it pickles as an inert standard-library callable) and torch.jit.script refuses it.
    catch_forward_oom: bool = False
    max_steps: int = 0  # end the process cleanly after this many completed steps (0: no limit)
    try_techniques: list[str] = field(default_factory=list)  # see TECHNIQUES (memscope whatif)
    simulate_gpu: int = 0  # bytes: cap each CUDA device's allocator to this much (0: no cap)
    tensor_peak: bool = False  # exact peak of live tensor bytes per step, from step 1 (costly: what-ifs)
    # activation_checkpointing through checkpoint_sequential as the estimator planned it:
    # {"container": dotted name of an nn.Sequential, "segments": N} (memscope whatif sets it)
    checkpoint_plan: dict[str, Any] | None = None
    # selective_checkpointing: the aten ops (overload packets, "aten.mm") whose outputs are kept;
    # None: every op with a FLOP formula. sac_profile: profile the first repeated block's first
    # forward op by op (memscope.agent.whatif.sac_profile; memscope whatif sets both)
    sac_save: list[str] | None = None
    sac_blocks: int = 0  # checkpoint only the first N repeated blocks (0: every one)
    sac_profile: bool = False
    # report's selective_checkpointing suggestion on a plain run: one forward of the first repeated
    # block profiled op by op, once, on a step after warm-up (hooks on that block instance only,
    # removed right after; memscope.agent.whatif.sac_once). Off in whatif's own runs.
    block_profile: bool = True
    # the command line as stored (memscope/redact.py): values of secret options and URL user
    # information replaced by ***, names matching any of ``redact_patterns`` too; False keeps it whole
    redact: bool = True
    redact_patterns: list[str] = field(default_factory=list)

    def validate(self) -> "AgentOptions":
        if not 0.1 <= self.sample_hz <= 1000:
            raise ValueError(f"sample_hz must be between 0.1 and 1000, not {self.sample_hz}")
        if self.nvml_interval < 0.1:
            raise ValueError(f"nvml_interval must be at least 0.1 s, not {self.nvml_interval}")
        if isinstance(self.layers_every, bool) or not isinstance(self.layers_every, int) or self.layers_every < 0:
            raise ValueError(f"layers_every must be an integer >= 0, not {self.layers_every!r}")
        if isinstance(self.layers_first, bool) or not isinstance(self.layers_first, int) or self.layers_first < 0:
            raise ValueError(f"layers_first must be an integer >= 0, not {self.layers_first!r}")
        if (isinstance(self.inventory_every, bool) or not isinstance(self.inventory_every, int)
                or self.inventory_every < 0):
            raise ValueError(f"inventory_every must be an integer >= 0, not {self.inventory_every!r}")
        if not 0 <= self.inventory_budget <= 1:
            raise ValueError(f"inventory_budget must be between 0 and 1, not {self.inventory_budget!r}")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 0:
            raise ValueError(f"max_steps must be an integer >= 0, not {self.max_steps!r}")
        if (not isinstance(self.try_techniques, (list, tuple))
                or any(t not in TECHNIQUES for t in self.try_techniques)):
            raise ValueError(f"unknown technique in {self.try_techniques!r}; known: {', '.join(TECHNIQUES)}")
        if isinstance(self.simulate_gpu, bool) or not isinstance(self.simulate_gpu, int) or self.simulate_gpu < 0:
            raise ValueError(f"simulate_gpu must be a byte count >= 0, not {self.simulate_gpu!r}")
        plan = self.checkpoint_plan
        if plan is not None and not (isinstance(plan, dict) and isinstance(plan.get("container"), str)
                                     and type(plan.get("segments")) is int and plan["segments"] >= 2):
            raise ValueError(f"checkpoint_plan must be {{'container': NAME, 'segments': N >= 2}}, not {plan!r}")
        if self.sac_save is not None and not (isinstance(self.sac_save, list)
                                              and all(isinstance(o, str) for o in self.sac_save)):
            raise ValueError(f"sac_save must be a list of op names like 'aten.mm', not {self.sac_save!r}")
        if isinstance(self.sac_blocks, bool) or not isinstance(self.sac_blocks, int) or self.sac_blocks < 0:
            raise ValueError(f"sac_blocks must be an integer >= 0, not {self.sac_blocks!r}")
        if not isinstance(self.redact, bool):
            raise ValueError(f"redact must be True or False, not {self.redact!r}")
        if not isinstance(self.redact_patterns, (list, tuple)):
            raise ValueError(f"redact_patterns must be a list of regular expressions, not {self.redact_patterns!r}")
        for pattern in self.redact_patterns:
            check_pattern(pattern)
        if self.queue_size < 100:
            raise ValueError("queue_size must be at least 100")
        return self

    def profiles_layers(self, step: int) -> bool:
        """Whether per-layer profiling runs on ``step``."""
        return (self.layers_every > 0 and step >= self.layers_first
                and (step - self.layers_first) % self.layers_every == 0)

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> "AgentOptions":
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown memscope option(s): {', '.join(sorted(unknown))}")
        values = dict(values)
        if isinstance(values.get("simulate_gpu"), str):  # "24GiB" in Python as on the command line
            values["simulate_gpu"] = parse_size(values["simulate_gpu"])
        if isinstance(values.get("redact_patterns"), str):  # one pattern
            values["redact_patterns"] = [values["redact_patterns"]]
        if isinstance(values.get("try_techniques"), str):  # one technique, or "a,b"
            values["try_techniques"] = [t for t in values["try_techniques"].split(",") if t]
        if "inventory_every" in values and "inventory_budget" not in values:
            values["inventory_budget"] = 0.0  # an explicit cadence is kept as asked
        return cls(**values).validate()

    @classmethod
    def from_env(cls) -> "AgentOptions":
        raw = os.environ.get(ENV_OPTIONS)
        return cls.from_mapping(json.loads(raw)) if raw else cls()

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def techniques_wanted(options: AgentOptions) -> bool:
    """Whether the agent needs memscope.agent.whatif.techniques (imported only then)."""
    return bool(options.max_steps or options.try_techniques or options.simulate_gpu or options.tensor_peak
                or options.sac_profile)


def block_profile_wanted(options: AgentOptions) -> bool:
    """Whether the default one-forward block profile runs: not beside whatif's own profile or
    a technique that wraps the blocks (their forwards run under checkpoint there)."""
    return options.block_profile and not (options.sac_profile or options.try_techniques)

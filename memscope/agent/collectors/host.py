"""What a collector may ask of the agent: the whole interface, and nothing else.

Collectors (leak inventories, creation sites, OOM post-mortems, what-if techniques) are handed
an object with this shape and never reach into the agent's private members; typing against the
protocol, not :class:`memscope.agent.runtime.agent.Agent`, keeps agent/ free of import circles.
"""

from __future__ import annotations

from typing import Any, Protocol

from memscope.agent.runtime.config import AgentOptions


class CollectorHost(Protocol):
    options: AgentOptions
    proc_id: int | None
    running: bool  # False once the agent stopped (or in a forked DataLoader worker)

    @property
    def current_step(self) -> int:
        """The step in progress (steps are numbered from 0)."""

    @property
    def step_start(self) -> float:
        """time.time() at which the step in progress began."""

    @property
    def phase(self) -> str:
        """forward / backward / optimizer / other: where the training thread is."""

    def insert(self, table: str, row: dict[str, Any]) -> bool:
        """Queue one row for the run file; False when it was dropped (never blocks)."""

    def event(self, kind: str, message: str, data: Any = None) -> None:
        """Queue an event row."""

    def optimizers(self) -> list[Any]:
        """The optimizers seen so far (strong references only for the call's duration)."""

    def graph_saved_ids(self) -> set[int]:
        """ids of the tensor objects the agent's own saved-tensor hooks handed autograd and that
        are still saved (a kept graph holds them through a Python reference)."""

    def rss(self) -> int:
        """This process's resident set size now, in bytes."""

    def latest_breakdown(self) -> dict[str, Any] | None:
        """The breakdown of the last profiled step (parameters, gradients, ...), if any."""

    def module_prefix(self, module: Any) -> str:
        """The dotted prefix that names ``module`` as the model the user built sees it."""

    def module_name(self, module: Any) -> str | None:
        """The full name per-layer rows gave ``module``, a root seen on a profiled step (its
        model's prefix, then its dotted name in the outermost module holding it); None before
        its step's rows were named. A lookup: no gc walk."""

    def models(self) -> list[Any]:
        """The outermost modules seen on profiled steps that are still alive (strong references
        only for the call's duration)."""

    def nvml_memory(self, index: int) -> dict[str, int | None] | None:
        """NVML's reading of CUDA device ``index`` now: ``used``, ``total`` (all processes) and
        ``process_used`` (this process, when NVML can tell); None without NVML."""

    def stop(self) -> None:
        """Stop the agent (hooks removed, rows flushed)."""

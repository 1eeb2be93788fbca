"""What both framework callbacks do: start (or join) the agent, mark optimizer steps, stop.

A step is an optimizer step, taken from the framework's own counter (Lightning's
``trainer.global_step``, the HF ``state.global_step``): with gradient accumulation the callback
is called once per micro-batch but the counter moves once per optimizer step, and memscope marks
a step only when it moved. Under ``memscope attach`` the agent already runs: the session joins
it, marks steps and never stops it.

The run name has no column in the run file: it is recorded as a ``run_name`` event (message: the
name; data: the framework and its step counter when recording began), which readers look up
with ``reader.events("run_name")``.
"""

from __future__ import annotations

from typing import Any

from memscope.agent.runtime.config import AgentOptions


class Session:
    def __init__(self, framework: str, db: str | None, name: str | None,
                 options: dict[str, Any]) -> None:
        options = dict(options)
        force = options.pop("force", False)  # as memscope.start(): about the run file
        group_readable = options.pop("group_readable", False)
        for key, value in (("force", force), ("group_readable", group_readable)):
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be True or False, not {value!r}")
        AgentOptions.from_mapping(options)  # a bad option fails here, before any training
        self.framework = framework
        self.db = db
        self.name = name
        self.force = force
        self.group_readable = group_readable
        self.options = options
        self.owns_agent = False  # this session started the agent, so it stops it
        self.active = False
        self._last_step: int | None = None
        self.missed = 0  # step marks that failed (counted, and said in an event)

    def begin(self, global_step: int) -> None:
        """At the start of training. Raises if the run file cannot be created (like
        ``memscope.start``): better to stop before the first step than to train unrecorded."""
        from memscope.agent.runtime import api

        agent = api.current()
        if agent is None:
            agent = api.start(self.db, force=self.force, group_readable=self.group_readable, **self.options)
            self.owns_agent = True
        self.active = True
        self._last_step = int(global_step)
        if self.name:
            agent.event("run_name", self.name,
                        {"name": self.name, "framework": self.framework,
                         "global_step": int(global_step)})

    def step(self, global_step: int) -> None:
        """After a batch: mark a memscope step when the optimizer-step counter moved."""
        if not self.active:
            return
        try:
            global_step = int(global_step)
            if self._last_step is not None and global_step != self._last_step:
                from memscope.agent.runtime import api

                api.step()
            self._last_step = global_step
        except Exception as exc:  # the recorder never breaks the training; it says what it missed
            self.missed += 1
            if self.missed == 1:
                self._degraded(f"the {self.framework} callback could not mark a step "
                               f"({type(exc).__name__}: {exc}); its steps may be merged",
                               {"global_step": self._last_step, "error": f"{type(exc).__name__}: {exc}"})

    def _degraded(self, message: str, data: dict[str, Any]) -> None:
        """A ``recording_degraded`` event (``memscope report`` lists these); best effort."""
        try:
            from memscope.agent.runtime import api

            agent = api.current()
            if agent is not None:
                agent.event("recording_degraded", f"recording degraded: {message}",
                            {"source": f"{self.framework} callback", "missed_steps": self.missed, **data})
        except Exception:
            pass

    def end(self) -> None:
        if not self.active:
            return
        self.active = False
        if self.missed > 1:
            self._degraded(f"the {self.framework} callback could not mark {self.missed} steps", {})
        if self.owns_agent:
            self.owns_agent = False
            try:
                from memscope.agent.runtime import api

                api.stop()
            except Exception:
                pass

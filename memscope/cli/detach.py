"""``memscope detach PID``: end the recording of a process attached by pid; it goes on."""

from __future__ import annotations

from memscope.cli.attach_pid import HELP, detach, register_detach

register = register_detach
run = detach

__all__ = ["HELP", "register", "run"]

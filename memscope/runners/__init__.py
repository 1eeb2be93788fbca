"""Runners: code that launches training processes (attach's supervisor, ``estimate SCRIPT``,
``whatif``). They sit beside the CLI, above analysis: analysis never starts a process."""

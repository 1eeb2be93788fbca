"""The agent's start-up and wiring: autostart and bootstrap, the Agent, config, watchdog, API.

Imports nothing here: the CLI and runners read memscope.agent.runtime.config without torch."""

"""Errors shared by every layer above the store (floor: imports nothing of memscope)."""


class UserError(Exception):
    """Bad input from the user: printed as one line on stderr, exit status 2."""


class TorchMissing(UserError, ImportError):
    """Recording asked for in an interpreter without torch (reading run files needs none).

    An ImportError still, as the ModuleNotFoundError it replaces; one line in IPython."""

    def _render_traceback_(self) -> list[str]:
        return [f"memscope: error: {self}"]

"""Errors shared by every layer above the store (floor: imports nothing of memscope)."""


class UserError(Exception):
    """Bad input from the user: printed as one line on stderr, exit status 2."""

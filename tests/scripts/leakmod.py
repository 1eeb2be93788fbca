"""A module the leak-holder script imports: its global list is a holder of its own."""

BUFFER = []


def keep(t):
    BUFFER.append(t)

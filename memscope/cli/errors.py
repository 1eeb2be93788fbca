class CliError(Exception):
    """Bad input: printed as one line on stderr, exit status 2."""

from memscope.errors import UserError as CliError

__all__ = ["CliError"]

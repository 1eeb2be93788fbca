"""The in-process agent: the only part of memscope that imports torch."""

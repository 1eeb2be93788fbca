"""Callbacks that record a framework's training with memscope, named and stepped by the framework.

``memscope.integrations.lightning.MemscopeCallback`` (Lightning) and
``memscope.integrations.huggingface.MemscopeCallback`` (Hugging Face ``Trainer``). Each module
imports its framework; this package imports neither.
"""

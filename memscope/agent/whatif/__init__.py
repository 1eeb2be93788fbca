"""The in-process half of ``memscope whatif``: techniques applied to an unchanged script, the
exact live-tensor peak that measures them, the ``--simulate-gpu`` cap."""

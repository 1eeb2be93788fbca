"""Constants both sides of the run file use (floor: imports nothing of memscope).

The agent (writing side) and analysis (reading side) must agree on these; neither imports the
other, so they live here."""

# Leak verdicts ignore inventories before this step: lazy optimizer state appears in steps 0 and 1.
WARMUP_STEPS = 2

"""Constants both sides of the run file use (floor: imports nothing of memscope).

The agent (writing side) and analysis (reading side) must agree on these; neither imports the
other, so they live here."""

# Leak verdicts ignore inventories before this step: lazy optimizer state appears in steps 0 and 1.
WARMUP_STEPS = 2

# Bytes of one autograd node kept alive after backward (its C++ object, edges, emptied saved-variable
# slots): RSS growth / node growth over 18,000 steps of ``total_loss += loss`` on an MLP measured
# 817 bytes a node, 11 nodes a step. An estimate (node sizes vary by operation): the agent uses it
# to rank growth, the report to estimate a graph-node leak's bytes.
NODE_BYTES = 800

"""What the agent measures in the training process: samples, steps, layers, leaks, OOMs."""

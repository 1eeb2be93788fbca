"""What the agent must know about torch to stay correct and out of the way: compile, checkpoint
regions, module names, optimizer state, storages, frameworks, torch-function modes."""

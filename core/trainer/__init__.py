"""The async shell: the orchestrator, the composition root, the step thread, signals, stopping."""

"""The training job users hold: the async resource that builds its parts, trains, evaluates,
predicts and measures itself, and the read-only views of it."""

"""The synchronous core: one optimizer step, an epoch, accumulation, recovery from
failures, evaluation. Plain PyTorch run on the step thread; nothing here awaits."""

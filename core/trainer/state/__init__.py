"""What a run holds and hands back: its parts once built, the state a checkpoint carries
beside the tensors, the early-stopping tally and the results of ``train()``."""

"""What a run holds and hands back: the state a checkpoint carries beside the tensors and
the results of ``train()``."""

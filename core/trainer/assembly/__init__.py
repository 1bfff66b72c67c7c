"""The composition root: the runtime objects checked, the model transformed, the optimizer
and scheduler made, and every part of a run built from its config tree (``build``)."""

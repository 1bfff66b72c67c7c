"""The ErrorHandler: classify a failure and decide what happens next.

For now it guards user input on the hot path: every batch must be a pair or a mapping, every
loss a scalar floating tensor. The checks read only Python attributes and tensor metadata,
so they never synchronise with the device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from core.batches import describe
from core.errors import BatchFormatError, LossFormatError

__all__ = ("ErrorHandler",)


class ErrorHandler:
    """Checks what the user's data and model hand to the step loop."""

    def check_batch(self, batch: Any, *, epoch: int, batch_index: int) -> Any:
        """Return ``batch`` if it is an ``(inputs, targets)`` pair or a mapping; else raise."""
        if isinstance(batch, Mapping) or (isinstance(batch, (tuple, list)) and len(batch) == 2):
            return batch
        raise BatchFormatError(
            f"batch {batch_index} of epoch {epoch} is {describe(batch)}; allowed: an "
            "(inputs, targets) tuple or list, or a dict of keyword arguments for a model "
            "that returns its own loss. Fix: make the dataset return (inputs, target) pairs "
            "or pass a collate_fn that builds one of these forms."
        )

    def check_loss(self, loss: Any, *, epoch: int, batch_index: int) -> torch.Tensor:
        """Return ``loss`` if it is a 0-d floating tensor; else raise naming what it was."""
        if isinstance(loss, torch.Tensor) and loss.ndim == 0 and loss.is_floating_point():
            return loss
        raise LossFormatError(
            f"the loss of batch {batch_index} in epoch {epoch} is {describe(loss)}; allowed: "
            "a scalar (0-d) floating-point tensor. Fix: use a loss_fn with reduction='mean' "
            "(or 'sum'), or for dict batches make the model return the loss, a dict with "
            "'loss', or an object with a .loss attribute."
        )

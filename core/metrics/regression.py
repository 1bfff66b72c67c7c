"""Regression metrics: ``MeanAbsoluteError``, accumulated as a total and a count on the device."""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from core.data.batches import describe
from core.metrics.base import Metric

__all__ = ("MeanAbsoluteError",)


class MeanAbsoluteError(Metric):
    """The mean of ``|outputs - targets|`` over every element, as ``nn.L1Loss`` computes it.

    Outputs of the targets' shape plus a trailing dimension of size 1 (a regression head's
    ``(N, 1)`` against targets ``(N,)``) are read without that dimension.

    >>> mae = MeanAbsoluteError()
    >>> mae.update(torch.tensor([[1.0], [2.0], [4.0]]), torch.tensor([1.5, 2.0, 2.0]))
    >>> mae.compute(mae.state())
    0.8333333333333334
    """

    def __init__(self) -> None:
        super().__init__(size=2)  # [sum of absolute errors, number of elements]

    @override
    def update(self, outputs: Any, targets: Any) -> None:
        if (
            isinstance(outputs, torch.Tensor)
            and isinstance(targets, torch.Tensor)
            and outputs.shape == (*targets.shape, 1)
        ):
            outputs = outputs.squeeze(-1)
        if not (
            isinstance(outputs, torch.Tensor)
            and isinstance(targets, torch.Tensor)
            and outputs.shape == targets.shape
        ):
            raise ValueError(
                f"MeanAbsoluteError() got outputs {describe(outputs)} and targets "
                f"{describe(targets)}; allowed: tensors of one shape (or outputs with an extra "
                "trailing dimension of size 1). Fix: reshape the outputs to the targets' shape."
            )
        errors = (outputs.float() - targets.float()).abs()
        count = torch.full((), errors.numel(), dtype=torch.float64, device=errors.device)
        self.add(torch.stack([errors.sum(dtype=torch.float64), count]))

    @override
    def compute(self, state: torch.Tensor) -> float | None:
        total, count = state.tolist()
        return total / count if count else None

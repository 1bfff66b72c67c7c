"""What a model may add to a step: loss terms of its own, and per-step statistics.

A mixture-of-experts model adds its load-balancing loss to every micro-batch's loss and
reports per-expert token counts (``core.moe.probe.MoEProbe`` implements this). The step
asks for the terms after each forward, packs the statistics with the step's other device
scalars (one lagged readback) and merges the fields they become into ``train_step``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

__all__ = ("ModelTerms", "StepFields", "StepTermsLike")

StepFields = Callable[[Sequence[float]], dict[str, Any]]


class StepTermsLike(Protocol):
    tensor: torch.Tensor
    """1-D device tensor of the step's statistics."""

    def fields(self, values: Sequence[float], /) -> dict[str, Any]:
        """Their host values -> ``train_step`` fields."""
        ...


class ModelTerms(Protocol):
    def begin_step(self) -> None:
        """A step starts: statistics count from zero."""

    def auxiliary_loss(self) -> torch.Tensor | None:
        """The loss terms of the forward just run (taken), or None."""

    def collect(self) -> StepTermsLike:
        """The step's statistics, at its end."""

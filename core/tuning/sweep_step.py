"""One step of the learning-rate range test, taken as the run takes its steps.

Autocast, the run's loss check (``ErrorHandler.check_loss``), the precision's (scaled)
backward, then the run's own post-backward sequence (``core.loop.step.build_update``: clip,
step or skip on overflow or non-finite gradients, scale update, gradients cleared). The sweep reads
each step's loss; it keeps nothing else of the update.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core.data.batches import to_device
from core.distributed.base import Strategy
from core.loop.objective import Objective
from core.loop.recovery import ErrorHandler
from core.loop.step import build_update
from core.precision.plugins import Precision
from core.tuning.config import LRFinderConfig

__all__ = ("SweepStep",)


class SweepStep:
    """The sweep's optimizer step on ``model`` (module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        objective: Objective,
        amp: Precision,
        config: LRFinderConfig,
        device: torch.device,
        params: list[nn.Parameter],
    ) -> None:
        self.model, self.optimizer, self.objective, self.amp = model, optimizer, objective, amp
        self.device = device
        self.errors = ErrorHandler()
        self.update = build_update(
            optimizer,
            Strategy(device),
            optim=config,  # its max_grad_norm, validated with the sweep's settings
            guard_nonfinite=self.errors.config.skip_nonfinite,
            params=params,
        )

    def __call__(self, batch: Any, lr: float, step: int) -> torch.Tensor:
        """Step ``step`` of the sweep at learning rate ``lr``; its loss (detached)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with self.amp.autocast():
            _outputs, loss = self.objective(self.model, to_device(batch, self.device))
        loss = self.errors.check_loss(loss, epoch=0, batch_index=step)
        self.amp.backward(loss)
        self.update.apply(self.amp)  # the sweep reads the loss
        return loss.detach()

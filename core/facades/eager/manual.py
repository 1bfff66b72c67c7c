"""Seed 000's four calls: ``forward_pass``, ``compute_loss``, ``backward_pass``,
``optimizer_step``, made of the step loop's own pieces.

The first call of a step opens it (``PrecisionPolicy.begin_step``); ``optimizer_step`` is the
step loop's post-backward sequence (``core.loop.step.build_update``), settled at once.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import torch
from torch import nn

from core.data.batches import to_device
from core.distributed.base import Strategy
from core.facades.eager.emit import Emit
from core.hardware.device import device_of
from core.loop.recorder import Readback, StepOutcome, StepRecorder, StepScalars
from core.loop.recovery import ErrorHandler
from core.loop.step import Clipping, GradientUpdate, build_update
from core.precision.plugins import Precision
from core.precision.policy import PrecisionPolicy

__all__ = ("ManualSteps",)


class ManualSteps:
    """Seed 000's ``forward_pass``/``compute_loss``/``backward_pass``/``optimizer_step``."""

    def __init__(
        self,
        policy: PrecisionPolicy,
        *,
        emit: Emit,
        optim: Clipping,
        errors: ErrorHandler | None = None,
    ) -> None:
        self.policy = policy
        self.device = policy.device
        self.strategy = Strategy(self.device)
        self.errors = errors or ErrorHandler()
        self.optim = optim
        self.recorder = StepRecorder(
            scheduler=None,
            precision=policy,
            errors=self.errors,
            device=device_of(self.device),
            emit=emit,
        )
        self.steps_done = 0
        self._open: Precision | None = None
        self._started = 0.0
        self._losses: list[torch.Tensor] = []
        self._samples = 0
        self._update: GradientUpdate | None = None

    def _precision(self) -> Precision:
        if self._open is None:
            self._open = self.policy.begin_step()
            self._started = perf_counter()
        return self._open

    def forward_pass(self, model: nn.Module, data: Any) -> Any:
        """``model(data)`` under autocast, ``data`` moved to the device."""
        with self._precision().autocast():
            return model(to_device(data, self.device))

    def compute_loss(self, criterion: Any, predictions: Any, targets: Any) -> torch.Tensor:
        """``criterion(predictions, targets)`` under autocast; must be a scalar tensor."""
        targets = to_device(targets, self.device)
        with self._precision().autocast():
            loss = criterion(predictions, targets)
        if isinstance(targets, torch.Tensor) and targets.ndim > 0:
            self._samples += int(targets.shape[0])
        return self.errors.check_loss(loss, epoch=0, batch_index=self.steps_done)

    def backward_pass(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """The precision's backward of ``loss`` (``optimizer``: the seed's signature, unused)."""
        self._precision().backward(loss)
        self._losses.append(loss.detach().float())

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Unscale, clip, step or skip, update the scale, clear the gradients; returns the
        step's ``loss`` (mean of its backward losses), ``grad_norm``, ``loss_scale``,
        ``overflow``, ``skipped``, ``lr``, ``step_time``."""
        if not self._losses:
            raise RuntimeError(
                "optimizer_step() was called with no backward_pass() since the last step; "
                "gradients from a plain loss.backward() would not be unscaled correctly. "
                "Fix: call backward_pass(loss, optimizer) before optimizer_step(optimizer)."
            )
        precision = self._precision()
        ones = [1] * len(self._losses)  # the step's loss: the mean of its backward losses
        applied = self._update_of(optimizer).apply(precision)
        readback = Readback(self._losses, ones, None, *applied)
        self.steps_done += 1
        samples = self._samples or len(self._losses)
        self.recorder.defer(
            StepOutcome(readback, 0, self.steps_done, samples, perf_counter() - self._started, 0.0)
        )
        scalars = self.recorder.settle()  # read back now: the facade is synchronous
        assert isinstance(scalars, StepScalars)  # deferred just above
        step_time = perf_counter() - self._started
        self._open, self._losses, self._samples = None, [], 0
        return {
            "loss": scalars.loss,
            "grad_norm": scalars.grad_norm,
            "loss_scale": scalars.loss_scale,
            "overflow": scalars.overflow,
            "skipped": scalars.skipped,
            "lr": readback.lr,
            "step_time": step_time,
        }

    def _update_of(self, optimizer: torch.optim.Optimizer) -> GradientUpdate:
        if self._update is None or self._update.optimizer is not optimizer:
            self._update = build_update(
                optimizer,
                self.strategy,
                optim=self.optim,
                guard_nonfinite=self.errors.config.skip_nonfinite,
            )
        return self._update

"""Applying (or skipping) an optimizer step, and the default optimizer.

A step whose gradients overflowed (fp16) or are not finite must leave weights, optimizer
state and step count untouched. On CUDA, fused optimizers (``AdamW(fused=True)``,
``Adam``, ``SGD``) accept the flag as a tensor and skip on the device, so the host never
waits; other optimizers can only skip from the host, at one device sync per step. On CPU
the host decides: reading a CPU scalar costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from core.hardware.device import device_of

__all__ = (
    "DeviceSkippingStepper",
    "OptimizerStepper",
    "SkipFlag",
    "default_optimizer",
    "stepper_for",
)

SkipFlag = torch.Tensor | bool | None
"""Whether a step was skipped: a device tensor (read later), a known bool, or None (a step
that could not be skipped)."""


class OptimizerStepper:
    """Steps the optimizer unless the loss scaler found an overflow or (with the non-finite
    guard) the gradient norm is inf/NaN, deciding on the host.

    On CPU reading a value costs nothing, and skipping in Python spares the optimizer any
    extra work. On CUDA this is the fallback for non-fused optimizers: one sync per step.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, guard_nonfinite: bool) -> None:
        self.optimizer = optimizer
        self.guard_nonfinite = guard_nonfinite

    def step(self, found_inf: torch.Tensor | None, grad_norm: torch.Tensor) -> SkipFlag:
        if found_inf is None and not self.guard_nonfinite:
            self.optimizer.step()
            return None
        skip = found_inf is not None and bool(found_inf.item())  # host read (see class doc)
        if not skip and self.guard_nonfinite:
            skip = not math.isfinite(float(grad_norm))
        if not skip:
            self.optimizer.step()
        return skip


class DeviceSkippingStepper(OptimizerStepper):
    """CUDA with a fused optimizer (``AdamW(fused=True)``, Adam, SGD): the skip happens on
    the device and the host never waits."""

    def step(self, found_inf: torch.Tensor | None, grad_norm: torch.Tensor) -> SkipFlag:
        if found_inf is None and self.guard_nonfinite:
            found_inf = (~torch.isfinite(grad_norm)).float()
        # Fused kernels read these attributes: grads are already unscaled (grad_scale None)
        # and the update, step count included, is skipped where found_inf is non-zero.
        self.optimizer.found_inf = found_inf  # type: ignore[attr-defined]
        self.optimizer.grad_scale = None  # type: ignore[attr-defined]
        self.optimizer.step()
        return found_inf


def stepper_for(
    optimizer: torch.optim.Optimizer, device: torch.device, *, guard_nonfinite: bool
) -> OptimizerStepper:
    """The stepper for ``optimizer`` on ``device`` (chosen once)."""
    fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
    kind = DeviceSkippingStepper if fused and device_of(device).is_cuda else OptimizerStepper
    return kind(optimizer, guard_nonfinite=guard_nonfinite)


def default_optimizer(
    params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    """AdamW, fused where torch supports it (floating parameters on CPU or CUDA)."""
    params = list(params)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)

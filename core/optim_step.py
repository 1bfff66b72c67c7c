"""Applying (or skipping) an optimizer step, and the default optimizer.

A step whose gradients overflowed must leave weights, optimizer state and step count
untouched. Fused optimizers (``AdamW(fused=True)``, ``Adam``, ``SGD``) accept the overflow
flag as a tensor and skip on the device, so the host never waits. Other optimizers can only
skip from the host: that costs one device sync per optimizer step, and only on steps that
can overflow (fp16 with loss scaling).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ("OptimizerStepper", "default_optimizer")


class OptimizerStepper:
    """Steps ``optimizer`` unless ``found_inf`` is set."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.skips_on_device = bool(getattr(optimizer, "_step_supports_amp_scaling", False))

    def step(self, found_inf: torch.Tensor | None) -> None:
        if self.skips_on_device:
            # Fused kernels read these attributes: grads are already unscaled (grad_scale None)
            # and the update, step count included, is skipped where found_inf is non-zero.
            self.optimizer.found_inf = found_inf  # type: ignore[attr-defined]
            self.optimizer.grad_scale = None  # type: ignore[attr-defined]
            self.optimizer.step()
        elif found_inf is None or not found_inf.item():  # host sync: see the module docstring
            self.optimizer.step()


def default_optimizer(
    params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    """AdamW, fused where torch supports it (floating parameters on CPU or CUDA)."""
    params = list(params)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)

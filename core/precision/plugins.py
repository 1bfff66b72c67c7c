"""Precision policies as small objects with one interface. ``FP32`` does nothing, ``Autocast``
(bf16/fp16) backs up plainly, ``ScaledFP16`` scales the backward, unscales with an overflow flag
and updates the scale; each overrides only what differs from fp32.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from core.precision.loss_scaler import DynamicLossScaler

__all__ = ("Autocast", "FP32", "Precision", "ScaledFP16")

_SHORT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class Precision:
    """The interface, implemented as fp32: no autocast, no loss scaling."""

    dtype: torch.dtype = torch.float32
    uses_autocast: bool = False
    scales_loss: bool = False
    """Whether backward scales the loss: only then do ``unscale_``, ``loss_scale`` and
    ``update`` do anything (``core.loop.step`` calls them only then)."""

    def __init__(self) -> None:
        self._context: AbstractContextManager[Any] = nullcontext()

    @property
    def name(self) -> str:
        return _SHORT_NAMES[self.dtype]

    def autocast(self) -> AbstractContextManager[Any]:
        """The context the forward pass and loss run in (re-entrant, created once)."""
        return self._context

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_(self, grads: Iterable[torch.Tensor]) -> torch.Tensor | None:
        """Undo loss scaling in place; return an overflow flag tensor, or None if unscaled."""
        return None

    def update(self, found_inf: torch.Tensor | None) -> None:
        """Called once per optimizer step, after the step (or its skip)."""

    @property
    def loss_scale(self) -> torch.Tensor | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (nothing for stateless precisions)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class FP32(Precision):
    """Full precision. Identical to the base class; named for readability."""


class Autocast(Precision):
    """``torch.autocast`` to bf16 or fp16 without loss scaling."""

    uses_autocast = True

    def __init__(self, dtype: torch.dtype, device_type: str, cache_enabled: bool = True) -> None:
        super().__init__()
        self.dtype = dtype
        self._context = torch.autocast(
            device_type=device_type, dtype=dtype, cache_enabled=cache_enabled
        )


class ScaledFP16(Autocast):
    """fp16 autocast with dynamic loss scaling; overflowing steps are skipped by the caller."""

    scales_loss = True

    def __init__(
        self, device_type: str, scaler: DynamicLossScaler, cache_enabled: bool = True
    ) -> None:
        super().__init__(torch.float16, device_type, cache_enabled)
        self.scaler = scaler

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale_loss(loss).backward()

    def unscale_(self, grads: Iterable[torch.Tensor]) -> torch.Tensor | None:
        return self.scaler.unscale_(grads)

    def update(self, found_inf: torch.Tensor | None) -> None:
        if found_inf is not None:
            self.scaler.update(found_inf)

    @property
    def loss_scale(self) -> torch.Tensor | None:
        return self.scaler.scale

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

"""Lagged device-to-host readback of a step's scalars.

Reading a CUDA scalar with ``.item()`` stalls the host until the GPU has drained its queue.
Instead, at the end of step N its scalars are packed into one small tensor and copied to
pinned host memory with ``non_blocking=True``; the host reads them during step N+1, after
N+1's forward and backward are queued, by which time the copy has usually landed. The wait,
if any, is for step N only, never for the work queued behind it. On CPU the copy is a no-op
and the read is immediate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ("Readback", "StepScalars")


@dataclass(frozen=True, slots=True)
class StepScalars:
    """Host values of one optimizer step."""

    loss: float
    grad_norm: float
    overflow: bool
    """Loss-scaled gradients held inf/NaN (always False without a loss scaler)."""
    skipped: bool
    """The optimizer step was not applied."""
    loss_scale: float | None


class Readback:
    """One step's device scalars on their way to the host."""

    __slots__ = ("_event", "_has_scale", "_host")

    def __init__(
        self,
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        found_inf: torch.Tensor | None,
        loss_scale: torch.Tensor | None,
    ) -> None:
        parts = [loss, grad_norm, found_inf if found_inf is not None else torch.zeros_like(loss)]
        if loss_scale is not None:
            parts.append(loss_scale)
        self._has_scale = loss_scale is not None
        packed = torch.stack([p.detach().reshape(()).float() for p in parts])
        self._host = packed.to("cpu", non_blocking=True)
        self._event: torch.cuda.Event | None = None
        if packed.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()

    def read(self) -> StepScalars:
        if self._event is not None:
            # Host sync, lagged: waits for the step this readback belongs to, not for later ones.
            self._event.synchronize()
        values = self._host.tolist()
        overflow = values[2] > 0
        return StepScalars(
            loss=values[0],
            grad_norm=values[1],
            overflow=overflow and self._has_scale,
            skipped=overflow,
            loss_scale=values[3] if self._has_scale else None,
        )

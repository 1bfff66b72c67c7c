"""Lagged device-to-host readback of a step's scalars.

Reading a CUDA scalar with ``.item()`` stalls the host until the GPU has drained its queue.
Instead, at the end of step N its scalars are packed into one small tensor and copied to
pinned host memory with ``non_blocking=True``; the host reads them during step N+1, after
N+1's forward and backward are queued, by which time the copy has usually landed. The wait,
if any, is for step N only, never for the work queued behind it. On CPU the copy is a no-op
and the read is immediate.
"""

from __future__ import annotations

from operator import mul
from typing import Any, NamedTuple

import torch

from core.loop.stepper import SkipFlag
from core.loop.terms import StepTermsLike

__all__ = ("Readback", "StepScalars")


class StepScalars(NamedTuple):
    """Host values of one optimizer step."""

    loss: float
    grad_norm: float
    overflow: bool
    """Loss-scaled gradients held inf/NaN (always False without a loss scaler)."""
    skipped: bool
    """The optimizer step was not applied."""
    loss_scale: float | None
    extra: dict[str, Any]
    """Fields of the model's own statistics (``core.loop.terms``); empty without."""


class Readback:
    """One step's device scalars on their way to the host, and the LR the step ran at.

    ``micro_losses`` are the (detached, 0-d) mean losses of the window's micro-batches and
    ``micro_samples`` their sample counts; the window's loss is their weighted mean,
    computed on the host so the step pays for no extra device ops. On CPU the values are
    read at once (there is nothing to wait for); on CUDA they are packed into one tensor,
    copied to pinned memory without blocking, and read after an event says they landed.
    The arguments come in the order a step knows them (``core.loop.step``).
    """

    __slots__ = (
        "_event",
        "_extra",
        "_has_flag",
        "_has_scale",
        "_host",
        "_known_skip",
        "_micro_samples",
        "_values",
        "lr",
    )

    def __init__(
        self,
        micro_losses: list[torch.Tensor],
        micro_samples: list[int],
        extra: StepTermsLike | None,
        grad_norm: torch.Tensor,
        skipped: SkipFlag,
        loss_scale: torch.Tensor | None,
        lr: float,
    ) -> None:
        self.lr = lr
        parts = [*micro_losses, grad_norm]
        self._known_skip = skipped if isinstance(skipped, bool) else None
        self._has_flag = isinstance(skipped, torch.Tensor)
        self._has_scale = loss_scale is not None
        if isinstance(skipped, torch.Tensor):
            parts.append(skipped)
        if loss_scale is not None:
            parts.append(loss_scale)
        self._micro_samples = micro_samples
        self._extra = extra
        self._event: torch.cuda.Event | None = None
        self._values: list[float] | None = None
        if grad_norm.device.type == "cpu":
            self._values = list(map(float, parts))
            if extra is not None:
                self._values += extra.tensor.tolist()
            return
        packed = torch.stack(parts)
        if extra is not None:
            packed = torch.cat([packed.float(), extra.tensor.to(packed.device, torch.float32)])
        self._host = packed.to("cpu", non_blocking=True)
        if grad_norm.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()

    def read(self) -> StepScalars:
        values = self._values
        if values is None:
            if self._event is not None:
                # Host sync, lagged: waits for the step this readback belongs to, not later ones.
                self._event.synchronize()
            values = self._host.tolist()
        n = len(self._micro_samples)
        fixed = n + 1 + int(self._has_flag) + int(self._has_scale)
        extra = {} if self._extra is None else self._extra.fields(values[fixed:])
        loss = sum(map(mul, values[:n], self._micro_samples))
        skipped = self._known_skip or (self._has_flag and values[n + 1] > 0)
        return StepScalars(
            loss=loss / sum(self._micro_samples),
            grad_norm=values[n],
            overflow=skipped and self._has_scale,
            skipped=skipped,
            loss_scale=values[fixed - 1] if self._has_scale else None,
            extra=extra,
        )

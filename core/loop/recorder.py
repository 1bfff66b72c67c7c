"""What follows a step once its numbers reach the host: the lagged readback and its records.

Step N hands its device scalars (loss, gradient norm, skip flag, loss scale) and its host
facts (step, LR, samples, timings) to :meth:`StepRecorder.defer`. Step N+1 calls
:meth:`StepRecorder.settle` after its own backward is queued and before its optimizer step;
settling step N then

1. reads its scalars back (the one host sync per step, lagged: see ``core.loop.readback``),
2. steps the LR scheduler if step N was applied (before step N+1's optimizer step, so the
   schedule is exactly that of an eager loop),
3. counts it in the precision statistics and the epoch statistics,
4. writes the ``train_step`` record (and ``nonfinite_skipped`` for a skipped finite-scale
   step),
5. lets the error handler judge it: too many non-finite steps raise, repeated fp16
   overflows at the minimum scale fall back to bf16 (a ``precision_fallback`` record).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple

from core.hardware.device import Device
from core.loop.readback import Readback, StepScalars
from core.loop.recovery import ErrorHandler
from core.precision.policy import MixedPrecisionTrainer

__all__ = (
    "DeviceFields",
    "EpochStats",
    "NOTHING_PENDING",
    "Scheduler",
    "StepOutcome",
    "StepRecorder",
    "no_device_fields",
)

Emit = Callable[..., None]
Scheduler = Any  # torch.optim.lr_scheduler.LRScheduler or anything with .step()
DeviceFields = Callable[[], dict[str, Any]]
"""Latest device utilisation and memory, merged into every ``train_step`` record."""


@dataclass
class EpochStats:
    epoch: int
    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    skipped_steps: int = 0
    time_s: float = 0.0
    data_time_s: float = 0.0
    interrupted: bool = False

    @property
    def loss(self) -> float | None:
        return self.loss_sum / self.samples if self.samples else None


class StepOutcome(NamedTuple):
    """A finished step whose device scalars are still on their way to the host."""

    readback: Readback
    epoch: int
    step: int
    lr: float
    samples: int
    step_time_s: float
    data_time_s: float


class _Nothing(enum.Enum):
    PENDING = "nothing pending"


NOTHING_PENDING: Final = _Nothing.PENDING
"""What :meth:`StepRecorder.settle` returns when no step waits to be read back."""
NothingPending = Literal[_Nothing.PENDING]


def no_device_fields() -> dict[str, Any]:
    return {"device_util_pct": None, "device_mem_used_bytes": None}


class StepRecorder:
    """Holds at most one step in flight and settles it: scheduler, statistics, records."""

    def __init__(
        self,
        *,
        scheduler: Scheduler | None,
        precision: MixedPrecisionTrainer,
        errors: ErrorHandler,
        device: Device,
        emit: Emit,
        device_fields: DeviceFields | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.precision = precision
        self.errors = errors
        self.device = device
        self.emit = emit
        self.device_fields: DeviceFields = device_fields or no_device_fields
        self.stats = EpochStats(epoch=0)
        """The running epoch's statistics; the loop replaces it when an epoch opens."""
        self._pending: StepOutcome | NothingPending = NOTHING_PENDING

    def defer(self, outcome: StepOutcome) -> None:
        """Keep step N until step N+1 (or a flush) settles it."""
        self._pending = outcome

    def settle(self) -> StepScalars | NothingPending:
        """Read back the step in flight, if any, and do everything that waits on its numbers."""
        pending, self._pending = self._pending, NOTHING_PENDING
        if pending is NOTHING_PENDING:
            return NOTHING_PENDING
        scalars = pending.readback.read()  # the lagged host sync
        if not scalars.skipped and self.scheduler is not None:
            self.scheduler.step()  # only for an applied step, before the next one
        self._count(pending, scalars)
        self._record(pending, scalars)
        self._judge(pending, scalars)
        return scalars

    def _count(self, pending: StepOutcome, scalars: StepScalars) -> None:
        self.precision.record_step(
            overflow=scalars.overflow,
            skipped=scalars.skipped,
            step_time_s=pending.step_time_s,
            counts_scaler_update=scalars.loss_scale is not None,
        )
        stats = self.stats
        stats.steps += 1
        stats.samples += pending.samples
        stats.loss_sum += scalars.loss * pending.samples
        stats.skipped_steps += int(scalars.skipped)
        stats.data_time_s += pending.data_time_s

    def _record(self, pending: StepOutcome, scalars: StepScalars) -> None:
        allocated, peak = self.device.allocated_and_peak()
        self.emit(
            "train_step",
            epoch=pending.epoch,
            step=pending.step,
            loss=scalars.loss,
            lr=pending.lr,
            grad_norm=scalars.grad_norm,
            loss_scale=scalars.loss_scale,
            overflow=scalars.overflow,
            skipped=scalars.skipped,
            samples=pending.samples,
            step_time_s=pending.step_time_s,
            data_time_s=pending.data_time_s,
            samples_per_s=pending.samples / pending.step_time_s if pending.step_time_s else None,
            mem_allocated_bytes=allocated,
            max_mem_allocated_bytes=peak,
            **self.device_fields(),
            **scalars.extra,
        )
        if scalars.skipped and not scalars.overflow:
            self.emit("nonfinite_skipped", epoch=pending.epoch, step=pending.step,
                      loss=scalars.loss, grad_norm=scalars.grad_norm)  # fmt: skip

    def _judge(self, pending: StepOutcome, scalars: StepScalars) -> None:
        """The error handler's verdict: raise after too many non-finite steps, or fall back."""
        fall_back = self.errors.after_step(
            step=pending.step, skipped=scalars.skipped, overflow=scalars.overflow,
            loss_scale=scalars.loss_scale, min_scale=self.precision.min_scale,
            loss_finite=math.isfinite(scalars.loss),
        )  # fmt: skip
        if fall_back:
            before, after = self.precision.fall_back()
            self.emit("precision_fallback", step=pending.step, from_precision=before,
                      to_precision=after, reason="overflow at min_scale")  # fmt: skip

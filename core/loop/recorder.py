"""What follows a step once its numbers reach the host: the lagged readback and its records.

Step N hands its device scalars (loss, gradient norm, skip flag, loss scale, correct and
counted predictions) and host facts (step, LR, samples, timings) to
:meth:`StepRecorder.defer`. Step N+1 calls
:meth:`StepRecorder.settle` after its own backward is queued and before its optimizer step;
settling step N reads its scalars back (:class:`Readback`: the one host sync per step,
lagged), steps the LR scheduler if step N was applied (so the schedule is that of an eager
loop), counts the step, writes its ``train_step`` record, and lets the error handler judge
a skipped step (too many non-finite steps raise; repeated fp16 overflows at the minimum
scale fall back to bf16).

Reading a CUDA scalar with ``.item()`` stalls the host until the GPU has drained its queue.
Instead step N's scalars are packed into one small tensor and copied to host memory with
``non_blocking=True``; the host reads them during step N+1, by which time the copy has
usually landed, and the wait, if any, is for step N only. On CPU the values are read at once.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import mul
from types import MappingProxyType
from typing import Any, Final, Literal, NamedTuple, Protocol

import torch

from core.hardware.device import Device
from core.loop.recovery import ErrorHandler
from core.loop.terms import StepTermsLike
from core.precision.policy import PrecisionPolicy

__all__ = (
    "DeviceFields",
    "EpochStats",
    "NOTHING_PENDING",
    "NoDeviceFields",
    "Readback",
    "Scheduler",
    "SkipFlag",
    "StepOutcome",
    "StepRecorder",
    "StepScalars",
)

Emit = Callable[..., None]
Scheduler = Any  # torch.optim.lr_scheduler.LRScheduler or anything with .step()
SkipFlag = torch.Tensor | bool | None
"""Whether a step was skipped: a device tensor (read later), a known bool, or None (a step
that could not be skipped)."""


class DeviceFields(Protocol):
    """Where ``train_step`` records find the latest device utilisation and memory: the
    monitor replaces ``record_fields`` after each sample, and a record merges it as it is."""

    @property
    def record_fields(self) -> Mapping[str, Any]: ...


class NoDeviceFields:
    """No monitor: both fields null."""

    record_fields: Mapping[str, Any] = MappingProxyType(
        {"device_util_pct": None, "device_mem_used_bytes": None}
    )


class StepScalars(NamedTuple):
    """Host values of one optimizer step."""

    loss: float
    grad_norm: float
    overflow: bool
    """Loss-scaled gradients held inf/NaN (always False without a loss scaler)."""
    skipped: bool
    """The optimizer step was not applied."""
    loss_scale: float | None
    accuracy: float | None
    """Correct / counted predictions over the step's batches; None unless class targets."""
    extra: dict[str, Any]
    """Fields of the model's own statistics (``core.loop.terms``); empty without."""


class Readback:
    """One step's device scalars on their way to the host, and the LR the step ran at.
    The window's loss is the mean of ``micro_losses`` weighted by ``micro_samples``, its
    accuracy the sum of ``hits``' correct over their counted (each micro-batch's pair, in
    turn; None: accuracy not counted), both computed on the host: the step pays for no
    extra device op."""

    __slots__ = (
        "_event",
        "_extra",
        "_has_flag",
        "_has_scale",
        "_hits",
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
        hits: Sequence[torch.Tensor] | None = None,
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
        self._hits = 0 if hits is None else len(hits)
        if hits is not None:
            parts += hits
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
        hits_end = fixed + self._hits
        counted = sum(values[fixed + 1 : hits_end : 2])
        extra = {} if self._extra is None else self._extra.fields(values[hits_end:])
        loss = sum(map(mul, values[:n], self._micro_samples))
        skipped = self._known_skip or (self._has_flag and values[n + 1] > 0)
        return StepScalars(
            loss=loss / sum(self._micro_samples),
            grad_norm=values[n],
            overflow=skipped and self._has_scale,
            skipped=skipped,
            loss_scale=values[fixed - 1] if self._has_scale else None,
            accuracy=sum(values[fixed:hits_end:2]) / counted if counted else None,
            extra=extra,
        )


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
    samples: int
    step_time_s: float
    data_time_s: float


class _Nothing(enum.Enum):
    PENDING = "nothing pending"


NOTHING_PENDING: Final = _Nothing.PENDING
"""What :meth:`StepRecorder.settle` returns when no step waits to be read back."""
NothingPending = Literal[_Nothing.PENDING]


class StepRecorder:
    """Holds at most one step in flight (``pending``) and settles it: scheduler, statistics,
    the ``train_step`` record, and the error handler's verdict on a skipped step."""

    def __init__(
        self,
        *,
        scheduler: Scheduler | None,
        precision: PrecisionPolicy,
        errors: ErrorHandler,
        device: Device,
        emit: Emit,
        device_fields: DeviceFields | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.precision = precision
        self.errors = errors
        self.emit = emit
        self.device_fields: DeviceFields = device_fields or NoDeviceFields()
        # Allocator counters where the device keeps them (CUDA); a CPU record holds nulls.
        self.memory = device.allocated_and_peak if device.counts_allocations else None
        self.stats = EpochStats(epoch=0)
        """The running epoch's statistics; the loop replaces it when an epoch opens."""
        self.pending: StepOutcome | None = None
        """Step N, kept until step N+1 (or a flush) settles it."""

    def defer(self, outcome: StepOutcome) -> None:
        self.pending = outcome

    def settle(self) -> StepScalars | NothingPending:
        """Read back the step in flight, if any, and do everything that waits on its numbers."""
        pending = self.pending
        if pending is None:
            return NOTHING_PENDING
        self.pending = None
        scalars = pending.readback.read()  # the lagged host sync
        skipped, overflow, samples = scalars.skipped, scalars.overflow, pending.samples
        if not skipped and self.scheduler is not None:
            self.scheduler.step()  # only for an applied step, before the next one
        self.precision.record_step(
            overflow=overflow,
            skipped=skipped,
            step_time_s=pending.step_time_s,
            counts_scaler_update=scalars.loss_scale is not None,
        )
        stats = self.stats
        stats.steps += 1
        stats.samples += samples
        stats.loss_sum += scalars.loss * samples
        stats.skipped_steps += skipped
        stats.data_time_s += pending.data_time_s
        allocated, peak = (None, None) if self.memory is None else self.memory()
        self.emit(
            "train_step",
            epoch=pending.epoch,
            step=pending.step,
            loss=scalars.loss,
            lr=pending.readback.lr,
            grad_norm=scalars.grad_norm,
            loss_scale=scalars.loss_scale,
            overflow=overflow,
            skipped=skipped,
            samples=samples,
            step_time_s=pending.step_time_s,
            data_time_s=pending.data_time_s,
            samples_per_s=samples / pending.step_time_s if pending.step_time_s else None,
            accuracy=scalars.accuracy,
            mem_allocated_bytes=allocated,
            max_mem_allocated_bytes=peak,
            **self.device_fields.record_fields,
            **scalars.extra,
        )
        if skipped or self.errors.streak_open:  # an applied step after none needs no verdict
            self._judge(pending, scalars)
        return scalars

    def _judge(self, pending: StepOutcome, scalars: StepScalars) -> None:
        """The error handler's verdict: raise after too many non-finite steps, or fall back."""
        if scalars.skipped and not scalars.overflow:
            self.emit(
                "nonfinite_skipped",
                epoch=pending.epoch,
                step=pending.step,
                loss=scalars.loss,
                grad_norm=scalars.grad_norm,
            )
        fall_back = self.errors.after_step(
            step=pending.step,
            skipped=scalars.skipped,
            overflow=scalars.overflow,
            loss_scale=scalars.loss_scale,
            min_scale=self.precision.min_scale,
            loss_finite=math.isfinite(scalars.loss),
        )
        if fall_back:
            before, after = self.precision.fall_back()
            self.emit(
                "precision_fallback",
                step=pending.step,
                from_precision=before,
                to_precision=after,
                reason="overflow at min_scale",
            )

"""One pass of evaluation: sample-weighted mean loss, accuracy where it applies, and the
user's metrics (a :class:`~core.metrics.MetricSet`).

Under a distributed strategy each rank evaluates its shard; samples that only pad a shard
still run forward (FSDP2 needs every rank in every all-gather) but are not counted, and the
sums (loss, accuracy and every metric's state) are all-reduced together, once, so the
metrics equal one process's. Nothing waits for the device before that all-reduce.

A failure names what failed (``validation_step``, ``loss_fn``, a metric), the epoch, the
optimizer step and the validation batch (``ErrorHandler.step_error``). A ``validation_step``
that returns metrics without a loss leaves the loss None. Every ``clear_cache_every`` batches
the device's caching allocator is emptied (memory freed during long evaluations).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from core.data.batches import count_samples, take_samples, to_device
from core.distributed import Strategy
from core.errors import EmptyLoaderError
from core.hardware.device import device_of
from core.loop.objective import NO_LOSS, Objective
from core.loop.recovery import ErrorHandler
from core.metrics import MetricSet
from core.precision.plugins import Precision

__all__ = ("EvalStats", "evaluate")


@dataclass(frozen=True)
class EvalStats:
    """What one evaluation measured; ``metrics`` are the user's, by name (None where
    undefined or not applicable); ``loss`` None where the ``validation_step`` returned no
    loss; ``cache_clears``: the times the device cache was emptied."""

    loss: float | None
    accuracy: float | None
    samples: int
    interrupted: bool = False
    metrics: dict[str, float | None] = field(default_factory=dict)
    cache_clears: int = 0


class LoggedSums:
    """A step function's logged values over an evaluation, each summed times its batch's
    samples on the device (names sorted: every rank packs them in the same order)."""

    def __init__(self, zero: torch.Tensor) -> None:
        self._zero = zero
        self._sums: dict[str, torch.Tensor] = {}

    def add(self, logged: Mapping[str, Any], samples: int) -> None:
        for name, value in logged.items():
            total = self._sums.get(name, self._zero)
            if isinstance(value, torch.Tensor):
                self._sums[name] = total + value.double() * samples
            else:
                self._sums[name] = total + float(value) * samples

    @property
    def names(self) -> list[str]:
        return sorted(self._sums)

    def state(self) -> list[torch.Tensor]:
        return [self._sums[name].reshape(1) for name in self.names]

    def means(self, sums: list[float], samples: float) -> dict[str, float | None]:
        return {
            name: total / samples if samples else None
            for name, total in zip(self.names, sums, strict=True)
        }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable[Any],
    *,
    epoch: int,
    stop: threading.Event,
    precision: Precision,
    strategy: Strategy,
    objective: Objective,
    errors: ErrorHandler,
    prepare_batch: Callable[[Any], Any] | None = None,
    metrics: MetricSet | None = None,
    step: int | None = None,
    clear_cache_every: int | None = None,
) -> EvalStats:
    """Mean loss (accuracy, ``metrics``) of ``model`` over ``loader``; ``prepare_batch``
    moves a batch to the device (and into channels_last where the model is). ``step``: the
    optimizer steps the model has taken, in a run. ``clear_cache_every``: empty the device's
    cache after every that many batches (None: never). An exception raised on the way
    becomes the error ``errors.step_error`` makes of it, naming where (the original chained).
    """
    at: int | None = 0  # the validation batch a failure names (None: after the last)
    try:
        model.eval()
        device = strategy.device
        if metrics is not None:
            metrics.reset(device)
        prepare = prepare_batch or partial(to_device, device=device)
        limit = strategy.eval_sample_limit(loader)
        zero = torch.zeros((), dtype=torch.float64, device=device)
        loss_sum, correct, counted = zero.clone(), zero.clone(), zero.clone()
        samples = loss_samples = cache_clears = 0
        accuracy_applies = True
        interrupted = False
        logged = LoggedSums(zero)
        for index, raw in enumerate(loader):
            batch = prepare(errors.check_batch(raw, epoch=epoch, batch_index=index))
            size = count_samples(batch)
            keep = size if limit is None else max(0, min(size, limit - samples))
            if 0 < keep < size:
                batch, size = take_samples(batch, keep), keep
            with precision.autocast():
                outputs, loss = objective(model, batch)
            if loss is not NO_LOSS:
                loss = errors.check_loss(
                    loss,
                    epoch=epoch,
                    batch_index=index,
                    step=step,
                    source=objective.loss_source_of(batch),
                    validation=True,
                )
            if keep:
                if loss is not NO_LOSS:
                    loss_sum += loss.detach().double() * size
                    loss_samples += size
                samples += size
                if objective.logs:
                    logged.add(objective.logged, size)
                hits = objective.correct(outputs, batch)
                if hits is None:
                    accuracy_applies = False
                else:
                    correct += hits[0]
                    counted += hits[1]
                if metrics is not None:
                    metrics.update(outputs, batch)
            if clear_cache_every is not None and (index + 1) % clear_cache_every == 0:
                device_of(device).empty_cache()  # a device sync on CUDA, every that many batches
                cache_clears += 1
            if strategy.should_stop(stop.is_set()):
                interrupted = True
                break
            at = index + 1  # the next: a loader that fails fetching it names it
        at = None
        interrupted |= strategy.settle_stop_votes()
        head = [loss_sum, zero + loss_samples, correct, counted, zero + samples]
        local = torch.stack([*head, zero + accuracy_applies])
        if metrics is not None:
            local = torch.cat([local, metrics.state()])
        local = torch.cat([local, *logged.state()])
        # Host sync, once per validation: early stopping needs the value now.
        summed = strategy.all_reduce_sum(local).cpu()
        totals = summed[: len(head) + 1].tolist()
        loss_total, with_loss, correct_total, counted_total, sample_total, applies = totals
        own = len(logged.names)
        values: dict[str, float | None] = {}
        if metrics is not None:
            values = metrics.compute(summed[len(totals) : len(summed) - own])
        values |= logged.means(summed[len(summed) - own :].tolist(), sample_total)
        if sample_total == 0 and interrupted:
            return EvalStats(
                loss=float("nan"),
                accuracy=None,
                samples=0,
                interrupted=True,
                metrics=dict.fromkeys(values),
                cache_clears=cache_clears,
            )
        if sample_total == 0:
            raise EmptyLoaderError(
                "val_loader yielded no batch; allowed: a loader with at least one batch, or "
                "val_loader=None. Fix: check the validation dataset, or pass val_loader=None."
            )
        accuracy = (
            correct_total / counted_total
            if applies == strategy.world_size and counted_total
            else None
        )
        return EvalStats(
            loss=loss_total / with_loss if with_loss else None,  # over the batches with a loss
            accuracy=accuracy,
            samples=int(sample_total),
            interrupted=interrupted,
            metrics=values,
            cache_clears=cache_clears,
        )
    except Exception as exc:
        error = errors.step_error(
            exc,
            epoch=epoch,
            step=step,
            batch_index=at,
            rank=strategy.rank,
            timeout_s=getattr(strategy, "timeout_s", None),
            phase="the validation",
            validation=True,
        )
        if error is exc:
            raise
        raise error from exc

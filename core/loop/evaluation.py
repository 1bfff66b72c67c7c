"""One pass of evaluation: sample-weighted mean loss, and accuracy where it applies.

Under a distributed strategy each rank evaluates its shard; samples that only pad a shard
still run forward (FSDP2 needs every rank in every all-gather) but are not counted, and the
sums are all-reduced, so the metrics equal one process's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from core.distributed import Strategy
from core.errors import EmptyLoaderError
from core.loop.batches import count_samples, take_samples, to_device
from core.loop.objective import Objective
from core.loop.recovery import ErrorHandler
from core.precision.plugins import Precision

__all__ = ("EvalStats", "evaluate")


@dataclass(frozen=True)
class EvalStats:
    loss: float
    accuracy: float | None
    samples: int
    interrupted: bool = False


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
) -> EvalStats:
    """Mean loss (and accuracy) of ``model`` over ``loader``; ``prepare_batch`` moves a batch
    to the device (and into channels_last where the model is)."""
    model.eval()
    device = strategy.device
    prepare = prepare_batch or partial(to_device, device=device)
    limit = strategy.eval_sample_limit(loader)
    zero = torch.zeros((), dtype=torch.float64, device=device)
    loss_sum, correct, counted = zero.clone(), zero.clone(), zero.clone()
    samples = 0
    accuracy_applies = True
    interrupted = False
    for index, raw in enumerate(loader):
        batch = prepare(errors.check_batch(raw, epoch=epoch, batch_index=index))
        size = count_samples(batch)
        keep = size if limit is None else max(0, min(size, limit - samples))
        if 0 < keep < size:
            batch, size = take_samples(batch, keep), keep
        with precision.autocast():
            outputs, loss = objective(model, batch)
        loss = errors.check_loss(loss, epoch=epoch, batch_index=index)
        if keep:
            loss_sum += loss.detach().double() * size
            samples += size
            hits = objective.correct(outputs, batch)
            if hits is None:
                accuracy_applies = False
            else:
                correct += hits[0]
                counted += hits[1]
        if strategy.should_stop(stop.is_set()):
            interrupted = True
            break
    interrupted |= strategy.settle_stop_votes()
    local = torch.stack([loss_sum, correct, counted, zero + samples, zero + accuracy_applies])
    # Host sync, once per validation: early stopping needs the value now.
    loss_total, correct_total, counted_total, sample_total, applies = strategy.all_reduce_sum(
        local
    ).tolist()
    if sample_total == 0 and interrupted:
        return EvalStats(loss=float("nan"), accuracy=None, samples=0, interrupted=True)
    if sample_total == 0:
        raise EmptyLoaderError(
            "val_loader yielded no batch; allowed: a loader with at least one batch, or "
            "val_loader=None. Fix: check the validation dataset, or pass val_loader=None."
        )
    accuracy = (
        correct_total / counted_total if applies == strategy.world_size and counted_total else None
    )
    return EvalStats(
        loss=loss_total / sample_total,
        accuracy=accuracy,
        samples=int(sample_total),
        interrupted=interrupted,
    )

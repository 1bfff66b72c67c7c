"""The synchronous step loop: one epoch of optimizer steps, and one pass of evaluation.

Plain PyTorch, run in a worker thread by the orchestrator; nothing in here awaits. One
optimizer step, top to bottom::

    window of batches -> each micro-batch: autocast(forward + loss) -> weighted backward
                         (gradient sync only on the window's last micro-batch)
    boundary:            unscale -> total norm -> clip -> [read back step N-1]
                         -> optimizer step (skipped on overflow) -> scale update

Host syncs: none per step on CUDA with a fused optimizer. Step N's loss, gradient norm,
overflow flag and loss scale are read back during step N+1 (see ``core.readback``); the LR
scheduler is stepped for step N at that point, only if step N was applied, which is before
step N+1's optimizer step, so the schedule is exactly that of an eager loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from time import perf_counter
from typing import Any, NamedTuple

import torch
from torch import nn

from core.batches import count_samples, take_samples, to_device
from core.error_handler import ErrorHandler
from core.errors import EmptyLoaderError
from core.gradient_accumulation import GradientAccumulation, Window
from core.memory import device_memory
from core.mixed_precision_training import MixedPrecisionTrainer
from core.objective import Objective
from core.optim_step import OptimizerStepper
from core.readback import Readback
from core.strategies import Strategy

__all__ = ("EpochStats", "EvalStats", "StepLoop")

Emit = Callable[..., None]
Scheduler = Any  # torch.optim.lr_scheduler.LRScheduler or anything with .step()


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


@dataclass(frozen=True)
class EvalStats:
    loss: float
    accuracy: float | None
    samples: int
    interrupted: bool = False


class _Pending(NamedTuple):
    """A finished step whose device scalars are still on their way to the host."""

    readback: Readback
    epoch: int
    step: int
    lr: float
    samples: int
    step_time_s: float
    data_time_s: float


class StepLoop:
    """Runs optimizer steps for the orchestrator; owns no thread and no file."""

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Scheduler | None,
        precision: MixedPrecisionTrainer,
        accumulation: GradientAccumulation,
        strategy: Strategy,
        objective: Objective,
        errors: ErrorHandler,
        max_grad_norm: float | None,
        emit: Emit,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.precision = precision
        self.accumulation = accumulation
        self.strategy = strategy
        self.objective = objective
        self.errors = errors
        self.max_grad_norm = max_grad_norm
        self.emit = emit
        self.device = strategy.device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.stepper = OptimizerStepper(optimizer)
        self.memory = device_memory(self.device)
        self.global_step = 0
        self._pending: _Pending | None = None
        self._stats = EpochStats(epoch=0)
        accumulation.install_sync_skipper(lambda: strategy.no_sync(model))

    # -- training -------------------------------------------------------------------------
    def run_epoch(self, loader: Iterable[Any], epoch: int, stop: threading.Event) -> EpochStats:
        """Train one epoch; return early, at a step boundary, once ``stop`` is set."""
        self.model.train()
        self.strategy.set_epoch(loader, epoch)
        self._stats = stats = EpochStats(epoch=epoch)
        batches = (
            self.errors.check_batch(batch, epoch=epoch, batch_index=index)
            for index, batch in enumerate(loader)
        )
        windows = self.accumulation.windows(batches)
        started = tick = perf_counter()
        while (window := next(windows, None)) is not None:
            data_time = perf_counter() - tick
            self._optimizer_step(window, epoch, data_time, tick)
            tick = perf_counter()
            if self.strategy.should_stop(stop.is_set()):  # agreed by all ranks
                stats.interrupted = True
                break
        stats.interrupted |= self.strategy.settle_stop_votes()
        self.flush()
        stats.time_s = perf_counter() - started
        if stats.steps == 0 and not stats.interrupted:
            raise EmptyLoaderError(
                f"train_loader yielded no batch in epoch {epoch}; allowed: a loader with at "
                "least one batch. Fix: check the dataset length and drop_last."
            )
        return stats

    def _optimizer_step(self, window: Window, epoch: int, data_time: float, tick: float) -> None:
        precision = self.precision.begin_step()
        normaliser = self.strategy.window_normaliser(window.samples)
        losses: list[torch.Tensor] = []
        sizes: list[int] = []
        for micro in self.accumulation.micro_batches(window):
            batch = to_device(micro.data, self.device)
            with self.accumulation.sync_context(micro):
                with precision.autocast():
                    _, loss = self.objective(self.model, batch)
                loss = self.errors.check_loss(
                    loss, epoch=epoch, batch_index=window.first_batch_index
                )
                precision.backward(loss * (micro.samples / normaliser))
            losses.append(loss.detach().float())
            sizes.append(micro.samples)

        grads = [p.grad for p in self.params if p.grad is not None]
        found_inf = precision.unscale_(grads)
        if found_inf is not None:
            found_inf = self.strategy.reduce_found_inf(found_inf)
        grad_norm = self.strategy.total_norm(grads)
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.max_grad_norm, grad_norm)

        self._resolve_pending()  # step N-1: read back, step the scheduler if it was applied
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.stepper.step(found_inf)
        readback = Readback(losses, sizes, grad_norm, found_inf, precision.loss_scale)
        precision.update(found_inf)
        self.optimizer.zero_grad(set_to_none=True)

        self.global_step += 1
        now = perf_counter()
        self._pending = _Pending(
            readback, epoch, self.global_step, lr, window.samples, now - tick, data_time
        )

    def _resolve_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        scalars = pending.readback.read()
        if not scalars.skipped and self.scheduler is not None:
            self.scheduler.step()
        self.precision.record_step(
            overflow=scalars.overflow,
            skipped=scalars.skipped,
            step_time_s=pending.step_time_s,
            counts_scaler_update=scalars.loss_scale is not None,
        )
        stats = self._stats
        stats.steps += 1
        stats.samples += pending.samples
        stats.loss_sum += scalars.loss * pending.samples
        stats.skipped_steps += int(scalars.skipped)
        stats.data_time_s += pending.data_time_s
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
            mem_allocated_bytes=self.memory.allocated(),
            max_mem_allocated_bytes=self.memory.max_allocated(),
        )

    def flush(self) -> None:
        """Read back the last step (end of epoch, before a checkpoint or a stop)."""
        self._resolve_pending()

    # -- evaluation -----------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, loader: Iterable[Any], epoch: int, stop: threading.Event) -> EvalStats:
        """Sample-weighted mean loss (and accuracy where it applies) over ``loader``.

        Under a distributed strategy each rank evaluates its shard; samples that only pad a
        shard still run forward (FSDP2 needs every rank in every all-gather) but are not
        counted, and the sums are all-reduced, so the metrics equal one process's.
        """
        self.model.eval()
        precision = self.precision.precision
        limit = self.strategy.eval_sample_limit(loader)
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        loss_sum, correct, counted = zero.clone(), zero.clone(), zero.clone()
        samples = 0
        accuracy_applies = True
        interrupted = False
        for index, raw in enumerate(loader):
            batch = to_device(
                self.errors.check_batch(raw, epoch=epoch, batch_index=index), self.device
            )
            size = count_samples(batch)
            keep = size if limit is None else max(0, min(size, limit - samples))
            if 0 < keep < size:
                batch, size = take_samples(batch, keep), keep
            with precision.autocast():
                outputs, loss = self.objective(self.model, batch)
            loss = self.errors.check_loss(loss, epoch=epoch, batch_index=index)
            if keep:
                loss_sum += loss.detach().double() * size
                samples += size
                hits = self.objective.correct(outputs, batch)
                if hits is None:
                    accuracy_applies = False
                else:
                    correct += hits[0]
                    counted += hits[1]
            if self.strategy.should_stop(stop.is_set()):
                interrupted = True
                break
        interrupted |= self.strategy.settle_stop_votes()
        local = torch.stack([loss_sum, correct, counted, zero + samples, zero + accuracy_applies])
        totals = self.strategy.all_reduce_sum(local)
        # Host sync, once per validation: early stopping needs the value now.
        loss_total, correct_total, counted_total, sample_total, applies = totals.tolist()
        if sample_total == 0 and interrupted:
            return EvalStats(loss=float("nan"), accuracy=None, samples=0, interrupted=True)
        if sample_total == 0:
            raise EmptyLoaderError(
                "val_loader yielded no batch; allowed: a loader with at least one batch, or "
                "val_loader=None. Fix: check the validation dataset, or pass val_loader=None."
            )
        world = self.strategy.world_size
        accuracy = correct_total / counted_total if applies == world and counted_total else None
        return EvalStats(
            loss=loss_total / sample_total,
            accuracy=accuracy,
            samples=int(sample_total),
            interrupted=interrupted,
        )

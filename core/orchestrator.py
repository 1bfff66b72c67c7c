"""The async shell behind ``await optimizer.train()``.

``OptimizedTrainingOptimizer`` owns one task group per run. Epochs and validation run in a
worker thread (``anyio.to_thread``) so the event loop stays responsive; the step thread
never waits on the loop (records reach async consumers through ``core.events``). Cancelling
``train()`` from any anyio cancel scope sets a stop flag: the thread finishes its current
optimizer step, the run is closed (``run_end`` with ``status="cancelled"``, files closed),
and the cancellation propagates.

Example::

    optimizer = create_optimized_training_optimizer(model=model, train_loader=loader)
    results = anyio.run(optimizer.train)
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import torch
from torch import nn

from core.config import TrainingConfig
from core.early_stopping import EarlyStopping
from core.error_handler import ErrorHandler
from core.events import EventHub, EventStream
from core.gradient_accumulation import GradientAccumulation
from core.mixed_precision_training import MixedPrecisionTrainer
from core.multi_gpu_training import MultiGPUTrainer
from core.objective import Objective
from core.openmp import release_thread_pool
from core.results import RunProgress, TrainingResults
from core.seeding import seed_everything
from core.step_loop import EpochStats, EvalStats, Scheduler, StepLoop
from core.telemetry import RunLog, new_run_id

__all__ = ("OptimizedTrainingOptimizer",)

R = TypeVar("R")


async def _in_step_thread(fn: Callable[..., R], *args: Any) -> R:
    """Run ``fn`` in a worker thread, with one OpenMP pool alive at a time (core.openmp)."""
    release_thread_pool()  # the event loop thread's, before the step thread builds its own
    return await anyio.to_thread.run_sync(_releasing_pool, fn, *args)


def _releasing_pool(fn: Callable[..., R], *args: Any) -> R:
    try:
        return fn(*args)
    finally:
        release_thread_pool()  # the step thread's: the application's own torch code stays fast


async def _drain_periodically(log: RunLog, interval_s: float) -> None:
    """Write queued records from the event loop, so the step thread never does I/O.

    Each drain competes for a core with the step; a quarter of a second keeps that cost
    below 1% on a 2-core CPU while the log and ``events()`` stay near-live.
    """
    while True:
        await anyio.sleep(interval_s)
        log.drain()


async def _stopped() -> bool:
    """After the ranks agreed to stop: re-raise this task's cancellation if it was cancelled;
    otherwise another rank asked to stop, and this one ends its run as interrupted."""
    await anyio.lowlevel.checkpoint()
    return True


async def _stop_when_cancelled(stop: threading.Event) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        stop.set()


class OptimizedTrainingOptimizer:
    """Composes precision, accumulation, distribution and error handling into a run."""

    def __init__(
        self,
        *,
        model: nn.Module,
        train_loader: Iterable[Any],
        val_loader: Iterable[Any] | None,
        config: TrainingConfig,
        mixed_precision: MixedPrecisionTrainer,
        accumulation: GradientAccumulation,
        multi_gpu_trainer: MultiGPUTrainer,
        optimizer: torch.optim.Optimizer,
        scheduler: Scheduler | None,
        objective: Objective,
        error_handler: ErrorHandler,
    ) -> None:
        self.model = model
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.config = config
        self.mixed_precision = mixed_precision
        self.accumulation = accumulation
        self.multi_gpu_trainer = multi_gpu_trainer
        self.strategy = strategy = multi_gpu_trainer.strategy
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.error_handler = error_handler
        self._hub = EventHub()
        self._log: RunLog | None = None
        self._loop = StepLoop(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            precision=mixed_precision,
            accumulation=accumulation,
            strategy=strategy,
            objective=objective,
            errors=error_handler,
            max_grad_norm=config.max_grad_norm,
            emit=self._emit,
        )
        self.early_stopping = EarlyStopping(
            config.early_stopping_patience, config.early_stopping_min_delta
        )
        self.epochs_completed = 0
        self.run_dir: Path | None = None
        self._running = False

    # -- public surface -------------------------------------------------------------------
    @property
    def global_step(self) -> int:
        return self._loop.global_step

    def close(self) -> None:
        """Release the process group this job created (call once, after the last train())."""
        self.multi_gpu_trainer.cleanup()

    def events(self, capacity: int | None = None) -> EventStream:
        """An async iterator over this run's records (those ``events.jsonl`` receives).

        Subscribe before or during ``train()``; the stream ends after ``run_end``. A consumer
        more than ``capacity`` records behind loses the oldest ones (``stream.dropped``);
        training never waits for it.
        """
        return self._hub.subscribe(capacity or self.config.event_buffer_size)

    async def train(self) -> TrainingResults:
        """Run epochs until ``max_epochs``, early stopping, an error or cancellation."""
        if self._running:
            raise RuntimeError("train() is already running on this optimizer")
        self._running = True
        stop = threading.Event()
        log = self._open_run()
        status, error = "failed", None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_when_cancelled, stop)
                tg.start_soon(_drain_periodically, log, self.config.log_flush_interval_s)
                try:
                    results = await self._fit(log, stop)
                except Exception as exc:  # re-raised unwrapped, after the task group closes
                    error = exc
                tg.cancel_scope.cancel()
            if error is not None:
                raise error
            status = "completed"
            return results
        except anyio.get_cancelled_exc_class():
            status = "cancelled"
            raise
        finally:
            self._close_run(log, status, error)
            self._running = False

    # -- the run --------------------------------------------------------------------------
    async def _fit(self, log: RunLog, stop: threading.Event) -> TrainingResults:
        progress = RunProgress()
        for epoch in range(self.epochs_completed, self.config.max_epochs):
            stats: EpochStats = await _in_step_thread(
                self._loop.run_epoch, self.train_loader, epoch, stop
            )
            progress.add_epoch(stats.samples, stats.time_s)
            if stats.interrupted:
                progress.interrupted = await _stopped()
                break
            progress.train_loss = monitored = self._mean_over_ranks(stats.loss_sum, stats.samples)
            if self.val_loader is not None:
                evaluation: EvalStats = await _in_step_thread(
                    self._loop.evaluate, self.val_loader, epoch, stop
                )
                if evaluation.interrupted:
                    progress.interrupted = await _stopped()
                    break
                progress.add_validation(evaluation.loss, evaluation.accuracy)
                monitored = evaluation.loss
                log.emit(
                    "validation",
                    epoch=epoch,
                    step=self.global_step,
                    val_loss=evaluation.loss,
                    val_accuracy=evaluation.accuracy,
                    samples=evaluation.samples,
                )
            self.epochs_completed = epoch + 1
            # Rank 0 decides, every rank follows: no rank is left waiting in a collective.
            progress.stopped_early = self.strategy.broadcast_object(
                self.early_stopping.update(monitored)
            )
            self.multi_gpu_trainer.record_epoch(stats.samples, stats.time_s)
            self._end_epoch(log, epoch, stats, progress)
            if progress.stopped_early:
                break
        return progress.results(
            epochs_completed=self.epochs_completed,
            global_step=self.global_step,
            run_dir=log.run_dir,
        )

    def _mean_over_ranks(self, total: float, count: int) -> float:
        sums = self.strategy.all_reduce_sum(torch.tensor([total, count], dtype=torch.float64))
        return float(sums[0] / sums[1])

    def _end_epoch(self, log: RunLog, epoch: int, stats: EpochStats, progress: RunProgress) -> None:
        log.emit(
            "epoch_end",
            epoch=epoch,
            step=self.global_step,
            train_loss=progress.train_loss,
            val_loss=progress.val_loss,
            val_accuracy=progress.val_accuracy,
            steps=stats.steps,
            skipped_steps=stats.skipped_steps,
            samples=stats.samples,
            epoch_time_s=stats.time_s,
            data_time_s=stats.data_time_s,
            samples_per_s=stats.samples / stats.time_s if stats.time_s else None,
            early_stopping_bad_epochs=self.early_stopping.bad_epochs,
            stopped_early=progress.stopped_early,
        )
        log.write_json("amp_stats.json", self.mixed_precision.get_amp_stats())
        log.drain()

    def _open_run(self) -> RunLog:
        cfg = self.config
        run_id = self.strategy.broadcast_object(new_run_id())
        log = RunLog.create(
            Path(cfg.log_dir), cfg.experiment_name, run_id, rank=self.strategy.rank, hub=self._hub
        )
        self._log = log
        self.run_dir = log.run_dir
        if cfg.seed is not None:
            seed_everything(cfg.seed)
        resolved = self.describe()
        log.write_json("config.json", resolved)
        log.emit(
            "run_start",
            config=resolved,
            torch_version=torch.__version__,
            python_version=platform.python_version(),
            device=str(self.strategy.device),
            precision=self.mixed_precision.precision.name,
            run_dir=str(log.run_dir),
        )
        return log

    def _close_run(self, log: RunLog, status: str, error: BaseException | None) -> None:
        self._loop.flush()
        log.write_json("amp_stats.json", self.mixed_precision.get_amp_stats())
        fields: dict[str, Any] = {
            "status": status,
            "epochs_completed": self.epochs_completed,
            "global_step": self.global_step,
            "best_metric": self.early_stopping.best,
            "events_dropped": self._hub.dropped,
        }
        if error is not None:
            fields["error_type"] = type(error).__name__
            fields["error"] = str(error)
        (log.error if status == "failed" else log.emit)("run_end", **fields)
        log.close()
        self._hub.close()

    def _emit(self, event: str, **fields: Any) -> None:
        if self._log is not None:
            self._log.emit(event, **fields)

    def describe(self) -> dict[str, Any]:
        """The resolved configuration of this job (what ``config.json`` holds)."""
        model = self.strategy.unwrap(self.model)
        return {
            "training": self.config.to_dict(),
            "mixed_precision": {
                **{k: _jsonable(v) for k, v in vars(self.mixed_precision.config).items()},
                "resolved_precision": self.mixed_precision.amp_precision.name,
            },
            "gradient_accumulation": vars(self.accumulation.config),
            "strategy": self.multi_gpu_trainer.get_training_info(),
            "model": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            "optimizer": type(self.optimizer).__name__,
            "optimizer_defaults": {k: _jsonable(v) for k, v in self.optimizer.defaults.items()},
            "scheduler": None if self.scheduler is None else type(self.scheduler).__name__,
            "loss_fn": _name(self._loop.objective.loss_fn),
        }


def _name(obj: object) -> str:
    return getattr(obj, "__name__", None) or type(obj).__name__


def _jsonable(value: object) -> object:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return str(value)

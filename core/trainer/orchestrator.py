"""The async shell behind ``await optimizer.train()``.

``OptimizedTrainingOptimizer`` owns one task group per run. Resuming, epochs, validation
and saves run on the run's step thread (``core.trainer.step_thread``) so the event loop stays
responsive; the step thread never waits on the loop (records reach async consumers through
``core.telemetry.events``).
Cancelling ``train()`` in any way (an anyio cancel scope, ``task.cancel()``,
``asyncio.wait_for``, ``asyncio.timeout``, Ctrl-C under ``asyncio.run``) sets a stop flag:
the thread finishes its current optimizer step, a checkpoint is written (shielded from the
cancellation; ``core.trainer.stopping``), the run is closed (``run_end`` with
``status="cancelled"``), and the cancellation propagates. With ``handle_signals=True``,
SIGTERM/SIGINT do the same and ``train()`` raises :class:`~core.errors.SignalReceived`.

Example::

    optimizer = create_optimized_training_optimizer(model=model, train_loader=loader)
    results = anyio.run(optimizer.train)
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn

from core.checkpointing.checkpointer import CheckpointConfig, Checkpointer
from core.config import TrainingConfig
from core.errors import NonFiniteLossError, OutOfMemoryError, SignalReceived, TrainingStepError
from core.loop.accumulation import GradientAccumulation
from core.loop.epoch import EpochStats, ResumePoint, Scheduler, StepLoop
from core.loop.evaluation import EvalStats, evaluate
from core.loop.objective import Objective
from core.loop.recovery import ErrorHandler
from core.loop.seeding import seed_everything
from core.monitoring.bottleneck import epoch_verdict
from core.monitoring.gpu_monitor import GPUMonitor, GPUMonitorConfig
from core.multi_gpu_training import MultiGPUTrainer
from core.precision.policy import MixedPrecisionTrainer
from core.telemetry.describe import describe_job, fingerprint, run_end_fields, run_start_fields
from core.telemetry.events import EventHub, EventStream
from core.telemetry.run_log import RunLog, new_run_id
from core.trainer.async_tools import drain_periodically, watch_data_stalls
from core.trainer.early_stopping import EarlyStopping
from core.trainer.results import TrainingResults
from core.trainer.run_state import RunState
from core.trainer.signals import watch_stop_signals
from core.trainer.step_thread import StepThread
from core.trainer.stopping import RunEnding, Stopping

__all__ = ("OptimizedTrainingOptimizer",)

_CHECKPOINT_AFTER = (TrainingStepError, NonFiniteLossError, OutOfMemoryError)


class OptimizedTrainingOptimizer:
    """Composes precision, accumulation, distribution, checkpoints and error handling."""

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
        checkpoint_config: CheckpointConfig,
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
        self.objective = objective
        self.error_handler = error_handler
        self._hub = EventHub()
        self._log: RunLog | None = None
        self._loop = StepLoop(
            model=model, optimizer=optimizer, scheduler=scheduler, precision=mixed_precision,
            accumulation=accumulation, strategy=strategy, objective=objective,
            errors=error_handler, max_grad_norm=config.max_grad_norm, emit=self._emit,
        )  # fmt: skip
        self._loop.on_step_end = self._checkpoint_if_due
        self.early_stopping = EarlyStopping(
            config.early_stopping_patience, config.early_stopping_min_delta
        )
        self.state = RunState(
            loop=self._loop, mixed_precision=mixed_precision, accumulation=accumulation,
            scheduler=scheduler, early_stopping=self.early_stopping, errors=error_handler,
            fingerprint=fingerprint(self),
        )  # fmt: skip
        directory = checkpoint_config.checkpoint_dir or (
            Path(config.log_dir) / config.experiment_name / "checkpoints"
        )
        self.checkpointer = Checkpointer(
            checkpoint_config, Path(directory), strategy=strategy, model=model,
            optimizer=optimizer, state=self.state, emit=self._emit, report_error=self._error,
        )  # fmt: skip
        self._stopping = Stopping(
            checkpointer=self.checkpointer, save=self._save, global_step=lambda: self.global_step,
            grace_s=config.stop_grace_s, emit=self._emit, error=self._error,
            close_log=lambda: self._log.close() if self._log is not None else None,
        )  # fmt: skip
        self.run_dir: Path | None = None
        self._running = False

    # -- public surface -------------------------------------------------------------------
    @property
    def global_step(self) -> int:
        return self._loop.global_step

    @property
    def epochs_completed(self) -> int:
        return self.state.epochs_completed

    def events(self, capacity: int | None = None) -> EventStream:
        """An async iterator over this run's records (those ``events.jsonl`` receives).

        Subscribe before or during ``train()``; the stream ends after ``run_end``. A consumer
        more than ``capacity`` records behind loses the oldest ones (``stream.dropped``);
        training never waits for it.
        """
        return self._hub.subscribe(capacity or self.config.event_buffer_size)

    def close(self) -> None:
        """Release the process group this job created (call once, after the last train())."""
        self.multi_gpu_trainer.cleanup()

    async def train(self) -> TrainingResults:
        """Run epochs until ``max_epochs``, early stopping, an error, a signal or cancellation."""
        if self._running:
            raise RuntimeError("train() is already running on this optimizer")
        self._running = True
        self._hub.reopen()
        worker = StepThread(threading.Event(), grace_s=self.config.stop_grace_s)
        end = RunEnding()
        log: RunLog | None = None
        try:
            log = self._open_run()
            monitor = self._monitor(log)
            run_scope = anyio.CancelScope()
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain_periodically, log, self.config.log_flush_interval_s)
                tg.start_soon(watch_data_stalls, self._loop, log, self.config.data_stall_warn_s)
                if self.config.handle_signals:
                    tg.start_soon(functools.partial(
                        watch_stop_signals, run_scope, end.signals,
                        on_hurry=self._stopping.hurry, on_force=self._stopping.force_exit,
                    ))  # fmt: skip
                if monitor is not None:
                    tg.start_soon(monitor.run)
                try:
                    return await self._supervise(worker, run_scope, end)
                except Exception as exc:  # re-raised unwrapped, after the task group
                    end.error = exc
                finally:
                    tg.cancel_scope.cancel()
            assert end.error is not None
            raise end.error
        finally:
            if worker.abandoned:
                end.status = "abandoned"
            self._close_run(log, end, worker)
            worker.close()
            self._running = False

    async def _supervise(
        self, worker: StepThread, run_scope: anyio.CancelScope, end: RunEnding
    ) -> TrainingResults:
        """The run itself, and the stop checkpoint whatever ends it."""
        try:
            with run_scope:  # cancelled by the first stop signal
                resume = await worker.call(self._resume)
                results = await self._fit(worker, resume)
            if end.signals:
                end.status = "stopped"
                checkpoint = await self._stopping.checkpoint(worker, "signal")
                raise SignalReceived(end.signals[0], checkpoint, abandoned=worker.abandoned)
            if results.interrupted:
                await self._stopping.checkpoint(worker, "stopped_by_peer")
            end.status = "stopped" if results.interrupted else "completed"
            return results
        except anyio.get_cancelled_exc_class():
            end.status = "cancelled"
            await self._stopping.checkpoint(worker, "cancel")
            raise
        except _CHECKPOINT_AFTER:
            if self.strategy.world_size == 1:
                await self._stopping.checkpoint(worker, "error", always=True)
            raise

    # -- the run --------------------------------------------------------------------------
    async def _fit(self, worker: StepThread, resume: ResumePoint | None) -> TrainingResults:
        log, stop = self._log, worker.stop
        assert log is not None  # opened by train()
        progress = self.state.progress
        for epoch in range(self.state.epochs_completed, self.config.max_epochs):
            started = time.monotonic()  # the monitor's clock: this epoch's samples follow
            stats: EpochStats = await worker.call(
                self._loop.run_epoch, self.train_loader, epoch, stop, resume
            )
            resume = None
            progress.add_epoch(stats.samples, stats.time_s)
            if stats.interrupted:
                progress.interrupted = await _stopped()
                break
            progress.train_loss = monitored = self._mean_over_ranks(stats.loss_sum, stats.samples)
            if self.val_loader is not None:
                evaluation = await worker.call(self._evaluate, epoch, stop)
                if evaluation.interrupted:
                    progress.interrupted = await _stopped()
                    break
                if not math.isfinite(evaluation.loss):
                    log.error(
                        "error", kind="nonfinite_validation_loss", epoch=epoch,
                        step=self.global_step, val_loss=evaluation.loss,
                        effect="not counted as an improvement by early stopping or best_val_loss",
                    )  # fmt: skip
                progress.add_validation(evaluation.loss, evaluation.accuracy)
                monitored = evaluation.loss
                log.emit(
                    "validation", epoch=epoch, step=self.global_step, val_loss=evaluation.loss,
                    val_accuracy=evaluation.accuracy, samples=evaluation.samples,
                )  # fmt: skip
            self.state.epochs_completed = epoch + 1
            # Rank 0 decides, every rank follows: no rank is left waiting in a collective.
            progress.stopped_early = self.strategy.broadcast_object(
                self.early_stopping.update(monitored)
            )
            self.multi_gpu_trainer.record_epoch(stats.samples, stats.time_s)
            self._end_epoch(log, epoch, stats, started)
            if self.checkpointer.due_after_epoch(self.state.epochs_completed):
                await worker.call(self._save, "epoch")
            if progress.stopped_early:
                break
        return progress.results(
            epochs_completed=self.epochs_completed,
            global_step=self.global_step,
            run_dir=log.run_dir,
        )

    def _evaluate(self, epoch: int, stop: threading.Event) -> EvalStats:
        assert self.val_loader is not None
        return evaluate(
            self.model, self.val_loader, epoch=epoch, stop=stop,
            precision=self.mixed_precision.precision, strategy=self.strategy,
            objective=self.objective, errors=self.error_handler,
        )  # fmt: skip

    def _mean_over_ranks(self, total: float, count: int) -> float:
        sums = self.strategy.all_reduce_sum(torch.tensor([total, count], dtype=torch.float64))
        return float(sums[0] / sums[1])

    def _end_epoch(self, log: RunLog, epoch: int, stats: EpochStats, started: float) -> None:
        progress = self.state.progress
        verdict = epoch_verdict(
            stats.time_s, stats.data_time_s, self.multi_gpu_trainer.gpu_monitor, started
        )
        log.emit(
            "epoch_end", epoch=epoch, step=self.global_step, train_loss=progress.train_loss,
            val_loss=progress.val_loss, val_accuracy=progress.val_accuracy, steps=stats.steps,
            skipped_steps=stats.skipped_steps, samples=stats.samples, epoch_time_s=stats.time_s,
            data_time_s=stats.data_time_s,
            samples_per_s=stats.samples / stats.time_s if stats.time_s else None,
            early_stopping_bad_epochs=self.early_stopping.bad_epochs,
            stopped_early=progress.stopped_early,
            input_stall_fraction=verdict["input_stall_fraction"],
            util_mean_pct=verdict["util_mean_pct"], bottleneck=verdict["verdict"],
            bottleneck_advice=verdict["advice"],
        )  # fmt: skip
        log.write_json("amp_stats.json", self.mixed_precision.get_amp_stats())
        log.drain()

    def _monitor(self, log: RunLog) -> GPUMonitor | None:
        """This run's device monitor (this rank's devices), or None when it is switched off."""
        if not self.multi_gpu_trainer.config.enable_gpu_monitoring:
            return None
        monitor = GPUMonitor(
            GPUMonitorConfig(interval_s=self.config.monitor_interval_s),
            device_indices=self.strategy.device_indices() or None,
            emit=log.emit,
        )

        self._loop.device_fields = monitor.step_record_fields
        self.multi_gpu_trainer.gpu_monitor = monitor
        return monitor

    # -- checkpoints ----------------------------------------------------------------------
    def _resume(self) -> ResumePoint | None:
        path = self.checkpointer.find()
        if path is None:
            return None
        return self.state.resume_point(self.checkpointer.load(path))

    def _checkpoint_if_due(self) -> None:
        """Called by the step thread after every optimizer step."""
        if self.checkpointer.due_after_step(self.global_step):
            self._save("step")

    def _save(self, reason: str) -> str | None:
        self._loop.flush()  # the last step's readback: scheduler and statistics up to date
        if self._log is not None:
            self._log.drain()  # every record up to the checkpoint is on disk first
        path = self.checkpointer.save(
            step=self.global_step, epoch=self.epochs_completed, reason=reason
        )
        return None if path is None else str(path)

    # -- the run's files ------------------------------------------------------------------
    def _open_run(self) -> RunLog:
        cfg = self.config
        run_id = self.strategy.broadcast_object(new_run_id())
        log = RunLog.create(
            Path(cfg.log_dir), cfg.experiment_name, run_id, rank=self.strategy.rank, hub=self._hub
        )
        self._log = log
        self.run_dir = log.run_dir
        self.checkpointer.begin_run(run_id)
        if cfg.seed is not None:
            seed_everything(cfg.seed)
        start = run_start_fields(self)
        log.write_json("config.json", start["config"])
        log.emit("run_start", **start)
        return log

    def _close_run(self, log: RunLog | None, end: RunEnding, worker: StepThread) -> None:
        """Write ``run_end`` and close the log and the event hub, whatever fails here:
        a consumer of ``events()`` always sees its stream end."""
        try:
            if log is None:
                return
            error = end.error
            if not worker.abandoned:  # an abandoned thread still owns the loop's state
                try:
                    self._loop.flush()
                except Exception as exc:  # the run already failed; keep the first error
                    error = error or exc
            log.write_json("amp_stats.json", self.mixed_precision.get_amp_stats())
            fields = run_end_fields(self, end.status, error, events_dropped=self._hub.dropped)
            fields["last_checkpoint"] = self.checkpointer.last_path
            (log.error if end.status in ("failed", "abandoned") else log.emit)("run_end", **fields)
        finally:
            try:
                if log is not None:
                    log.close()
            finally:
                self._hub.close()

    def _emit(self, event: str, **fields: Any) -> None:
        if self._log is not None:
            self._log.emit(event, **fields)

    def _error(self, event: str, **fields: Any) -> None:
        if self._log is not None:
            self._log.error(event, **fields)

    def describe(self) -> dict[str, Any]:
        """The resolved configuration of this job (what ``config.json`` holds)."""
        return describe_job(self)


async def _stopped() -> bool:
    """After the ranks agreed to stop: re-raise this task's cancellation if it was cancelled;
    otherwise another rank asked to stop, and this one ends its run as interrupted."""
    await anyio.lowlevel.checkpoint()
    return True

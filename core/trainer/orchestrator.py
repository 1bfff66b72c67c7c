"""``OptimizedTrainingOptimizer``: the async shell of a run, an async resource.

::

    async with OptimizedTrainingOptimizer(config, model=model, train_loader=loader) as run:
        results = await run.train()

Entering builds the parts (process group included) in a worker thread; leaving releases
them (``aclose()``). ``train()`` runs epochs on the run's step thread
(``core.trainer.step_thread``); the event loop only schedules. Cancelling ``train()`` in any
way (an anyio cancel scope, ``task.cancel()``, ``asyncio.wait_for``, ``asyncio.timeout``,
Ctrl-C under ``asyncio.run``) sets a stop flag: the thread finishes its optimizer step, a
checkpoint is written (shielded; ``core.trainer.stopping``), the run is closed (``run_end``
with ``status="cancelled"``) and the cancellation propagates. With
``run.handle_signals=True``, SIGTERM/SIGINT do the same and ``train()`` raises
:class:`~core.errors.SignalReceived`. Callbacks (``core.callbacks``) observe the records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import torch
from torch import nn

from core.callbacks import Callback
from core.checkpointing.lineage import Checkpoints
from core.config import TrainingConfig
from core.loop.epoch import Scheduler
from core.loop.objective import LossFn
from core.metrics import Metric, MetricFn
from core.monitoring.distribution import MonitoredDistribution
from core.precision.policy import MixedPrecisionTrainer
from core.telemetry.events import EventHub, EventStream
from core.telemetry.run_log import CurrentLog
from core.trainer.arguments import check_runtime
from core.trainer.benchmark import benchmark_performance, optimal_batch_size
from core.trainer.build import OptimizerArgument, Parts, Runtime, SchedulerArgument, build
from core.trainer.cycle import RunCycle
from core.trainer.inference import evaluate_with, predict_with
from core.trainer.inspection import checkpoints_of, describe
from core.trainer.observers import Observers, with_default_callbacks
from core.trainer.results import TrainingResults
from core.trainer.run import Run

__all__ = ("OptimizedTrainingOptimizer",)


class OptimizedTrainingOptimizer:
    """One training job: its config tree, its runtime objects and, once built, its parts.

    ``optimizer`` is a torch optimizer over ``model``'s parameters or a factory taking the
    parameters (default: AdamW from ``config.optim``, fused where supported); ``scheduler``
    a scheduler of that optimizer or a factory taking it. ``metrics`` maps names to
    :class:`~core.metrics.Metric` objects or ``(outputs, targets) -> tensor`` callables,
    computed at every validation (``val_<name>`` for ``monitor``). ``callbacks`` observe
    the records; a :class:`~core.console.ProgressBar` is added on rank 0 unless
    ``config.logging.progress`` is False or one is given. Bad arguments raise
    :class:`~core.errors.ConfigError` here, before anything is built.
    """

    def __init__(
        self,
        config: TrainingConfig | None = None,
        *,
        model: nn.Module,
        train_loader: Iterable[Any],
        val_loader: Iterable[Any] | None = None,
        loss_fn: LossFn | None = None,
        optimizer: OptimizerArgument | None = None,
        scheduler: SchedulerArgument | None = None,
        callbacks: Sequence[Callback] = (),
        metrics: Mapping[str, Metric | MetricFn] | None = None,
    ) -> None:
        self._config = config = TrainingConfig() if config is None else config
        self._runtime = Runtime(
            model, train_loader, val_loader, loss_fn, optimizer, scheduler, metrics
        )
        check_runtime(self._runtime, config, callbacks)
        self._callbacks = with_default_callbacks(callbacks, config)
        self._hub = EventHub()
        self._log = CurrentLog()
        self._parts: Parts | None = None
        self._cycle: RunCycle | None = None
        self._running = False
        self._run_dir: Path | None = None

    # -- the resource ---------------------------------------------------------------------
    async def __aenter__(self) -> OptimizedTrainingOptimizer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        await self.aclose()

    async def start(self) -> None:
        """Build the parts in a worker thread (idempotent; ``train()`` calls it)."""
        if self._parts is None:
            await anyio.to_thread.run_sync(self.build)

    def build(self) -> None:
        """Build the parts now, in this thread (the synchronous factory calls this)."""
        if self._parts is None:
            self._parts = build(
                self._config, self._runtime, emit=self._log.emit, report_error=self._log.error,
                on_step_end=self._on_step_end,
            )  # fmt: skip
            self._cycle = RunCycle(self._config, self._parts, self._hub, self._log)
            if self._parts.monitor is not None:  # the trainer's gpu_monitor reads the run's
                self._parts.trainer.attach_monitor(self._parts.monitor)

    async def aclose(self) -> None:
        """Release the process group this job created (in a worker thread)."""
        await anyio.to_thread.run_sync(self.close)

    def close(self) -> None:
        """Release the process group this job created (call once, after the last train())."""
        if self._parts is not None:
            self._parts.trainer.cleanup()
            if self._parts.monitor is not None:
                self._parts.monitor.close()

    # -- read-only views ------------------------------------------------------------------
    @property
    def config(self) -> TrainingConfig:
        return self._config

    @property
    def rank(self) -> int:
        return self._built.strategy.rank

    @property
    def world_size(self) -> int:
        return self._built.strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        return self.rank == 0

    @property
    def run_dir(self) -> Path | None:
        """The directory of the current or last run (None before the first)."""
        return self._run_dir

    @property
    def global_step(self) -> int:
        return self._built.loop.global_step

    @property
    def epochs_completed(self) -> int:
        return self._built.state.epochs_completed

    @property
    def last_checkpoint(self) -> str | None:
        """The newest checkpoint this job wrote or resumed from: the last good one."""
        return self._built.checkpointer.last_path

    @property
    def checkpoints(self) -> Checkpoints:
        """The checkpoint directory's checkpoints: ``.latest``, ``.best``, ``verify``,
        ``load``, ``lineage`` (``core.checkpointing.lineage``)."""
        return checkpoints_of(self._config, self._built)

    @property
    def strategy_name(self) -> str:
        """How the job is distributed: ``cpu``, ``single_gpu``, ``data_parallel``,
        ``distributed`` (DDP), ``fsdp`` or ``expert_parallel``."""
        return self._built.strategy.name

    @property
    def train_loader(self) -> Iterable[Any]:
        """This rank's training loader (under DDP/FSDP2 re-sharded with a sampler)."""
        return self._built.train_loader

    @property
    def model(self) -> nn.Module:
        """The model as trained (placed, and wrapped by DDP/FSDP2/DataParallel if used)."""
        return self._built.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._built.optimizer

    @property
    def scheduler(self) -> Scheduler | None:
        return self._built.scheduler

    @property
    def mixed_precision(self) -> MixedPrecisionTrainer:
        """The precision policy (seed 002's ``MixedPrecisionTrainer``: AMP switches, stats)."""
        return self._built.precision

    @property
    def multi_gpu_trainer(self) -> MonitoredDistribution:
        """Where the job runs, and its ``gpu_monitor`` (seed 004's ``MultiGPUTrainer``)."""
        return self._built.trainer

    @property
    def _built(self) -> Parts:
        if self._parts is None:
            raise RuntimeError(
                "this run is not built yet: use `async with OptimizedTrainingOptimizer(...) as "
                "run:`, `await run.start()`, or call train()"
            )
        return self._parts

    def events(self, capacity: int | None = None) -> EventStream:
        """An async iterator over this run's records (those ``events.jsonl`` receives).

        Subscribe before or during ``train()``; the stream ends after ``run_end``. A consumer
        more than ``capacity`` records behind loses the oldest ones (``stream.dropped``);
        training never waits for it.
        """
        return self._hub.subscribe(capacity or self._config.logging.event_buffer_size)

    def describe(self) -> dict[str, Any]:
        """What the config resolved to (each part's description, as in ``run_start``) and the
        plan: steps per epoch, effective batch, micro-batches as they stand now."""
        return describe(self._config, self._built)

    # -- using the trained model ----------------------------------------------------------
    async def evaluate(self, loader: Iterable[Any] | None = None) -> dict[str, float | None]:
        """Loss, accuracy and ``metrics=`` over ``loader`` (default: the ``val_loader``) on the
        run's device and precision; under several ranks, call it on every rank.

        ``{"loss": 0.31, "accuracy": 0.9, "f1": 0.88, "samples": 128.0}``"""
        parts = await self._idle("evaluate")
        return await anyio.to_thread.run_sync(evaluate_with, parts, loader)

    async def predict(self, loader: Iterable[Any]) -> list[Any]:
        """The model's outputs, one entry per batch of ``loader`` (this rank's shard under
        several ranks), moved to the CPU: ``torch.cat(await run.predict(loader))``."""
        parts = await self._idle("predict")
        return await anyio.to_thread.run_sync(predict_with, parts, loader)

    def benchmark_performance(self, num_iterations: int = 100) -> dict[str, Any]:
        """Average forward, backward and optimizer-step seconds over ``num_iterations`` steps
        on the run's batches, and ``samples_per_second``; training is unaffected (see
        :func:`core.trainer.benchmark.benchmark_performance`). Synchronous: in async code,
        ``await anyio.to_thread.run_sync(run.benchmark_performance, 20)``."""
        parts = self._ready("benchmark_performance")
        return benchmark_performance(parts, self._config, num_iterations)

    def get_optimal_batch_size(self, target_memory_usage: float = 0.8) -> int:
        """The largest batch size within ``target_memory_usage`` of the device's memory (CPU:
        of the available RAM); see :func:`core.trainer.benchmark.optimal_batch_size`."""
        parts = self._ready("get_optimal_batch_size")
        return optimal_batch_size(parts, self._config, target_memory_usage)

    def _ready(self, what: str) -> Parts:
        if self._running:
            raise RuntimeError(f"{what}() cannot run while train() runs on this job")
        self.build()
        return self._built

    async def _idle(self, what: str) -> Parts:
        if self._running:
            raise RuntimeError(f"{what}() cannot run while train() runs on this job")
        await self.start()
        return self._built

    # -- the run --------------------------------------------------------------------------
    async def train(self) -> TrainingResults:
        """Run epochs until ``max_epochs``, early stopping, an error, a signal or cancellation."""
        if self._running:
            raise RuntimeError("train() is already running on this optimizer")
        self._running = True
        try:
            await self.start()
            parts, cycle = self._built, self._cycle
            assert cycle is not None
            observers = Observers(
                self._callbacks, self, report=self._log.error, warn=self._log.warning,
                capacity=self._config.logging.event_buffer_size,
                grace_s=self._config.logging.callback_grace_s,
            )  # fmt: skip
            run = Run(self._config, parts, cycle, self._hub, observers)
            return await run.execute(self.describe(), on_open=self._opened)
        finally:
            self._running = False

    def _opened(self, run_dir: Path) -> None:
        self._run_dir = run_dir

    def _on_step_end(self, step: int) -> None:
        if self._cycle is not None:
            self._cycle.after_step(step)

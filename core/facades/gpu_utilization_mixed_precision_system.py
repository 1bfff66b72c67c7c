"""The facade of seed 000: the integrated GPU and mixed-precision training system.

``GPUConfig`` maps onto the config tree (``core.facades.integrated.config``),
``setup_training`` uses the batch-size search (``core.memory``), ``training_loop`` runs the
async orchestrator for a synchronous caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio
from torch import nn
from torch.utils.data import DataLoader, Dataset

from core.callbacks import Callback, RunInfo
from core.config import TrainingConfig
from core.data.loader import create_dataloader
from core.distributed.distribution import Distribution
from core.errors import config_error
from core.facades.flat import config_from_flat
from core.facades.integrated.config import GPUConfig, training_config
from core.facades.integrated.manager import GPUManager
from core.facades.integrated.monitor import GPUPerformanceMonitor
from core.facades.integrated.setup import setup_training
from core.facades.integrated.sync import running_event_loop
from core.facades.mixed_precision_training import MixedPrecisionConfig, MixedPrecisionTrainer
from core.facades.optimized_training_optimizer import OptimizedTrainingOptimizer
from core.loop.objective import LossFn
from core.memory import GPUMemoryOptimizer
from core.metrics import Metric, MetricFn
from core.trainer.assembly.optimization import OptimizerArgument, SchedulerArgument
from core.trainer.state.results import TrainingResults
from core.transforms.activation_checkpointing import find_blocks

__all__ = (
    "GPUConfig",
    "GPUManager",
    "GPUMemoryOptimizer",
    "GPUPerformanceMonitor",
    "IntegratedGPUTrainingSystem",
    "MixedPrecisionConfig",
    "MixedPrecisionTrainer",
)


class _EpochHistory(Callback):
    """Keeps every ``epoch_end`` record of a run (for ``training_loop``'s statistics)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    async def on_epoch_end(self, run: RunInfo, record: dict[str, Any]) -> None:
        self.records.append(record)


class IntegratedGPUTrainingSystem:
    """Seed 000's system: device settings, batch-size search, monitoring and training.

    ``mixed_precision_config`` is the whole precision section (default: ``config``'s);
    ``settings`` are flat keywords onto ``config``, as
    :func:`~core.create_optimized_training_optimizer` takes them; ``gpu_config``'s fields are
    written over both. The device is resolved once, here.

    Example::

        system = IntegratedGPUTrainingSystem(GPUConfig(), MixedPrecisionConfig(), log_dir="logs")
        setup_info = system.setup_training(model, (32, 784))
        stats = system.training_loop(model, loader, nn.CrossEntropyLoss(), optimizer, 10)
    """

    def __init__(
        self,
        gpu_config: GPUConfig | None = None,
        mixed_precision_config: MixedPrecisionConfig | None = None,
        *,
        config: TrainingConfig | None = None,
        **settings: Any,
    ) -> None:
        if gpu_config is not None and not isinstance(gpu_config, GPUConfig):
            raise config_error("gpu_config", gpu_config, "a GPUConfig or None", "GPUConfig().")
        if mixed_precision_config is not None and not isinstance(
            mixed_precision_config, MixedPrecisionConfig
        ):
            raise config_error(
                "mixed_precision_config",
                mixed_precision_config,
                "a MixedPrecisionConfig or None",
                "MixedPrecisionConfig(dtype='bfloat16').",
            )
        self.gpu_config = gpu_config or GPUConfig()
        self.mixed_precision_config = mixed_precision_config
        self._base = config_from_flat(settings, config)
        self.config = self.training_config(None)
        placement = Distribution(self.config.distributed)  # resolves; joins no process group
        self.device, self.training_mode = placement.device, placement.training_mode
        self.gpu_manager = GPUManager(self.gpu_config, self.device)
        self.memory_optimizer = GPUMemoryOptimizer(self.config.memory, device=self.device)
        indices = placement.strategy.device_indices() or None
        self.performance_monitor = GPUPerformanceMonitor(
            self.config.monitor, device_indices=indices
        )
        self.optimal_batch_size: int | None = None
        self.last_run: OptimizedTrainingOptimizer | None = None

    def training_config(self, model: nn.Module | None) -> TrainingConfig:
        """The config tree a run of ``model`` gets (``None``: no repeated blocks assumed)."""
        blocks = model is not None and bool(find_blocks(model))
        return training_config(
            self.gpu_config, self.mixed_precision_config, self._base, checkpoint_blocks=blocks
        )

    def setup_training(self, model: nn.Module, input_shape: Sequence[int]) -> dict[str, Any]:
        """Optimize ``model`` in place and find the largest batch size whose step fits
        (``core.facades.integrated.setup``), starting at ``input_shape[0]``."""
        config = self.training_config(model)
        report = setup_training(self.gpu_manager, model, input_shape, config)
        self.optimal_batch_size = report["optimal_batch_size"]
        return report | {"training_mode": self.training_mode}

    def create_dataloader(
        self,
        dataset: Dataset[Any],
        batch_size: int | None = None,
        *,
        shuffle: bool = True,
        **kwargs: Any,
    ) -> DataLoader[Any]:
        """A DataLoader with ``GPUConfig``'s loader fields; ``batch_size`` defaults to the
        size :meth:`setup_training` found."""
        size = batch_size if batch_size is not None else self.optimal_batch_size
        if size is None:
            raise config_error(
                "batch_size",
                None,
                "an integer >= 1",
                "pass batch_size=, or call setup_training(model, input_shape) first.",
            )
        return create_dataloader(
            dataset,
            size,
            shuffle=shuffle,
            device=self.device,
            config=self.config.data.loader,
            **kwargs,
        )

    def create_optimizer(
        self,
        model: nn.Module,
        train_loader: Iterable[Any],
        criterion: LossFn | None = None,
        optimizer: OptimizerArgument | None = None,
        num_epochs: int = 1,
        *,
        val_loader: Iterable[Any] | None = None,
        scheduler: SchedulerArgument | None = None,
        callbacks: Sequence[Callback] = (),
        metrics: Mapping[str, Metric | MetricFn] | None = None,
    ) -> OptimizedTrainingOptimizer:
        """The run :meth:`training_loop` trains, for async code::

        async with system.create_optimizer(model, loader, criterion, optimizer, 3) as run:
            results = await run.train()
        """
        config = self.training_config(model).replace({"run.max_epochs": num_epochs})
        return OptimizedTrainingOptimizer(
            config,
            model=model,
            train_loader=train_loader,
            val_loader=val_loader,
            loss_fn=criterion,
            optimizer=optimizer,
            scheduler=scheduler,
            callbacks=callbacks,
            metrics=metrics,
        )

    def training_loop(
        self,
        model: nn.Module,
        train_loader: Iterable[Any],
        criterion: LossFn | None = None,
        optimizer: OptimizerArgument | None = None,
        num_epochs: int = 1,
        *,
        val_loader: Iterable[Any] | None = None,
        scheduler: SchedulerArgument | None = None,
        callbacks: Sequence[Callback] = (),
        metrics: Mapping[str, Metric | MetricFn] | None = None,
    ) -> dict[str, Any]:
        """Train ``model`` for ``num_epochs`` from synchronous code (it runs an event loop
        of its own; ``RuntimeError`` inside one: use :meth:`create_optimizer`). Returns
        :class:`~core.TrainingResults`' fields plus per-epoch lists and ``gpu_summary``."""
        library = running_event_loop()
        if library is not None:
            raise RuntimeError(
                f"training_loop() runs an event loop of its own and cannot run inside the "
                f"running {library} event loop. Fix: in async code, build the run with "
                "`run = system.create_optimizer(model, train_loader, criterion, optimizer, "
                "num_epochs)` and call `async with run: stats = await run.train()`."
            )
        history = _EpochHistory()
        job = self.create_optimizer(
            model,
            train_loader,
            criterion,
            optimizer,
            num_epochs,
            val_loader=val_loader,
            scheduler=scheduler,
            callbacks=[*callbacks, history],
            metrics=metrics,
        )
        results, gpu_summary = anyio.run(_train, job)
        self.last_run = job
        epochs = history.records
        return results.to_dict() | {
            "train_losses": [record["train_loss"] for record in epochs],
            "val_losses": [record["val_loss"] for record in epochs],
            "epoch_times_s": [record["epoch_time_s"] for record in epochs],
            "samples_per_s_per_epoch": [record["samples_per_s"] for record in epochs],
            "device": str(job.distribution.device),
            "precision": job.mixed_precision.precision.name,
            "training_mode": job.distribution.training_mode,
            "gpu_summary": gpu_summary,
        }

    def cleanup(self) -> None:
        """Stop the performance monitor, drop the last run and free cached device memory."""
        self.performance_monitor.close()
        self.last_run = None
        self.gpu_manager.clear_memory()


async def _train(job: OptimizedTrainingOptimizer) -> tuple[TrainingResults, dict[str, Any]]:
    async with job:
        results = await job.train()
        return results, job.distribution.gpu_monitor.get_gpu_summary()

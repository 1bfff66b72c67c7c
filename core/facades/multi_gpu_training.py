"""The facade of distribution (seed 004): ``MultiGPUTrainer``, ``MultiGPUConfig`` and helpers.
The work is done by ``core.distributed`` (and the monitor by ``core.monitoring``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from core.config import TrainingConfig
from core.distributed.config import MultiGPUConfig, TrainingMode
from core.distributed.launch import (
    get_free_port,
    launch_distributed_training,
    setup_distributed_environment,
)
from core.distributed.selection import Machine
from core.errors import ConfigError
from core.facades.flat import config_from_flat
from core.facades.integrated.monitor import GPUPerformanceMonitor
from core.facades.optimized_training_optimizer import OptimizedTrainingOptimizer
from core.loop.objective import LossFn
from core.metrics import Metric, MetricFn
from core.monitoring.distribution import MonitoredDistribution
from core.trainer.state.results import TrainingResults

__all__ = (
    "Machine",
    "MultiGPUConfig",
    "MultiGPUTrainer",
    "TrainingMode",
    "create_multi_gpu_trainer",
    "get_free_port",
    "launch_distributed_training",
    "optimize_model_for_multi_gpu",
    "setup_distributed_environment",
)


class MultiGPUTrainer(MonitoredDistribution):
    """Seed 004's trainer: a :class:`~core.monitoring.distribution.MonitoredDistribution`
    whose :meth:`train` runs the orchestrator on the model and loader it prepared.

    Example::

        trainer = MultiGPUTrainer(MultiGPUConfig())
        loader = trainer.setup_dataloader(dataset, batch_size=32)
        model = trainer.initialize_training(model)
        results = await trainer.train(max_epochs=2)
        trainer.get_performance_summary()["throughput"]
    """

    monitor_class = GPUPerformanceMonitor
    _model: nn.Module | None = None  # the user's module, as given to initialize_training
    _loader: Iterable[Any] | None = None  # the loader setup_dataloader built

    def initialize_training(
        self, model: nn.Module, compute_dtype: torch.dtype = torch.float32
    ) -> nn.Module:
        """Place and wrap ``model`` for this mode; :meth:`train` trains it."""
        wrapped = super().initialize_training(model, compute_dtype)
        self._model = self.strategy.unwrap(wrapped)
        return wrapped

    def setup_dataloader(
        self, dataset: Dataset[Any], batch_size: int, *, shuffle: bool = True, **kwargs: Any
    ) -> DataLoader[Any]:
        """A DataLoader for ``dataset`` on this rank; :meth:`train` trains on it."""
        loader = super().setup_dataloader(dataset, batch_size, shuffle=shuffle, **kwargs)
        self._loader = loader
        return loader

    async def train(
        self,
        *,
        train_loader: Iterable[Any] | None = None,
        val_loader: Iterable[Any] | None = None,
        criterion: LossFn | None = None,
        optimizer: Any = None,
        max_epochs: int | None = None,
        metrics: Mapping[str, Metric | MetricFn] | None = None,
        config: TrainingConfig | None = None,
        **settings: Any,
    ) -> TrainingResults:
        """Train the model of :meth:`initialize_training` on the loader of
        :meth:`setup_dataloader` (or ``train_loader``), on every rank; ``settings`` are the
        factory's flat keywords. The run wraps the unwrapped model itself. Raises
        :class:`~core.errors.ConfigError` under ``training_mode="fsdp"`` (FSDP2 sharded the
        model in place already)."""
        model, loader = self._model, train_loader if train_loader is not None else self._loader
        if model is None:
            raise RuntimeError(
                "train() trains the model of initialize_training(model): call it first"
            )
        if loader is None:
            raise RuntimeError(
                "train() needs a loader: call setup_dataloader(dataset, batch_size) first, or "
                "pass train_loader="
            )
        if self.training_mode == "fsdp":
            raise ConfigError(
                "MultiGPUTrainer.train() cannot train a model initialize_training() already "
                "sharded with FSDP2 (fully_shard changes it in place). Fix: pass the unsharded "
                "model to create_optimized_training_optimizer(model=..., multi_gpu_config="
                "MultiGPUConfig(training_mode='fsdp')) and await its train()."
            )
        if max_epochs is not None:
            settings["max_epochs"] = max_epochs
        tree = config_from_flat(settings | {"multi_gpu_config": self.config}, config)
        job = OptimizedTrainingOptimizer(
            tree,
            model=model,
            train_loader=loader,
            val_loader=val_loader,
            loss_fn=criterion,
            optimizer=optimizer,
            metrics=metrics,
        )
        async with job:
            results = await job.train()
            self.merge_throughput(job.distribution)
        return results


def create_multi_gpu_trainer(
    config: MultiGPUConfig | None = None, **kwargs: Any
) -> MultiGPUTrainer:
    """``MultiGPUTrainer(MultiGPUConfig(**kwargs))``, or around ``config`` when given."""
    if config is not None and kwargs:
        raise ConfigError("pass either config= or MultiGPUConfig fields, not both")
    return MultiGPUTrainer(config or MultiGPUConfig(**kwargs))


def optimize_model_for_multi_gpu(
    model: nn.Module, **kwargs: Any
) -> tuple[nn.Module, MultiGPUTrainer]:
    """Resolve the mode from ``kwargs`` (MultiGPUConfig fields) and wrap ``model`` for it."""
    trainer = create_multi_gpu_trainer(**kwargs)
    return trainer.initialize_training(model), trainer

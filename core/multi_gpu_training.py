"""Seed face of distribution (seed 004): ``MultiGPUTrainer``, ``MultiGPUConfig`` and helpers.

The work is done by ``core.distributed``; this module keeps seed 004's names::

    cfg = MultiGPUConfig(training_mode="auto")
    optimizer = create_optimized_training_optimizer(model=model, train_loader=loader,
                                                    multi_gpu_config=cfg)
    # torchrun --standalone --nproc_per_node=2 train.py   -> DDP over 2 processes
"""

from __future__ import annotations

from typing import Any

from torch import nn

from core.distributed.config import MultiGPUConfig, TrainingMode
from core.distributed.launch import (
    get_free_port,
    launch_distributed_training,
    setup_distributed_environment,
)
from core.distributed.selection import Machine
from core.distributed.trainer import Distribution
from core.errors import ConfigError
from core.monitoring.gpu_monitor import GPUMonitor

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


class MultiGPUTrainer(Distribution):
    """Seed 004's trainer: :class:`~core.distributed.trainer.Distribution` plus the seed's
    on-request device sample."""

    def record_gpu_metrics(self) -> dict[str, Any] | None:
        """One sample of this rank's devices taken now (NVML, or psutil without GPUs); a
        run's own samples are its ``gpu_sample`` records."""
        monitor = GPUMonitor(device_indices=self.strategy.device_indices())
        try:
            return monitor.sample()
        finally:
            monitor.close()


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

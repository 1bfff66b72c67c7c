"""Where a job runs: one device, DataParallel, DDP or FSDP2 (seed 004's API, on torch.distributed).

``MultiGPUConfig(training_mode="auto")`` resolves once, when the trainer is built:

- inside a torchrun environment (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set): DDP (ask for
  FSDP2 with ``training_mode="fsdp"``);
- no CUDA: CPU;  one GPU: that GPU;
- several GPUs without torchrun: DataParallel when ``enable_data_parallel``, else one GPU,
  with a log line saying how to launch DDP.

Example::

    cfg = MultiGPUConfig(training_mode="auto")
    optimizer = create_optimized_training_optimizer(model=model, train_loader=loader,
                                                    multi_gpu_config=cfg)
    # torchrun --standalone --nproc_per_node=2 train.py   -> DDP over 2 processes
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from core.distributed.config import MultiGPUConfig, TrainingMode
from core.distributed.launch import (
    get_free_port,
    launch_distributed_training,
    setup_distributed_environment,
)
from core.distributed.selection import Machine, StrategyOptions, build_strategy, resolve_mode
from core.errors import ConfigError
from core.hardware.settings import GPUManager, GPUManagerConfig
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

_log = structlog.get_logger("core")


@dataclass
class _Throughput:
    epochs: int = 0
    samples: int = 0
    seconds: float = 0.0
    per_epoch: list[float] = field(default_factory=list)


class MultiGPUTrainer:
    """Resolves the mode, owns the strategy and its process group, and keeps the seed API."""

    def __init__(
        self,
        config: MultiGPUConfig | None = None,
        *,
        use_distributed_sampler: bool = True,
        seed: int = 0,
        machine: Machine | None = None,
        gpu_manager_config: GPUManagerConfig | None = None,
    ) -> None:
        self.config = config or MultiGPUConfig()
        self.machine = machine or Machine.detect()
        self.training_mode, self.notes = resolve_mode(self.config, self.machine)
        options = StrategyOptions(use_distributed_sampler, seed)
        self.strategy = build_strategy(self.training_mode, self.config, self.machine, options)
        self.gpu_manager = GPUManager(gpu_manager_config, self.strategy.device)
        self.device_settings: dict[str, Any] = {}
        self.gpu_monitor: GPUMonitor | None = None
        """The running job's monitor (set by the orchestrator for the length of a run)."""
        self._throughput = _Throughput()
        self._ready = False
        if self.machine.cuda_count > 1 and self.training_mode in ("single_gpu", "data_parallel"):
            for note in self.notes:  # actionable: tells how to use every GPU with DDP
                _log.warning("training_mode_resolved", training_mode=self.training_mode, note=note)

    @property
    def device(self) -> torch.device:
        return self.strategy.device

    def setup(self) -> None:
        """Join or create the process group (idempotent)."""
        if not self._ready:
            self.strategy.setup()
            self.device_settings = self.gpu_manager.apply()  # TF32, cudnn.benchmark, memory
            self._ready = True

    def initialize_training(
        self, model: nn.Module, compute_dtype: torch.dtype = torch.float32
    ) -> nn.Module:
        """Place and wrap ``model`` for this mode (DDP, FSDP2, DataParallel or none)."""
        self.setup()
        return self.strategy.wrap_model(model, compute_dtype=compute_dtype)

    def prepare_loader(self, loader: Iterable[Any], *, train: bool) -> Iterable[Any]:
        """This rank's loader: under DDP/FSDP2 re-sharded with a DistributedSampler (unless
        ``use_distributed_sampler=False``); a ``val_loader`` whose length differs between
        ranks raises :class:`~core.errors.UnevenLoadersError` here (call on every rank)."""
        return self.strategy.prepare_loader(loader, train=train)

    def setup_dataloader(
        self, dataset: Dataset[Any], batch_size: int, *, shuffle: bool = True, **kwargs: Any
    ) -> DataLoader[Any]:
        """A DataLoader for ``dataset``; under DDP/FSDP2 with this rank's DistributedSampler."""
        strategy = self.strategy
        if strategy.world_size > 1 or self.training_mode in ("distributed", "fsdp"):
            sampler: DistributedSampler[Any] = DistributedSampler(
                dataset,
                strategy.world_size,
                strategy.rank,
                shuffle=shuffle,
                seed=kwargs.pop("seed", 0),
            )
            return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, **kwargs)

    def get_training_info(self) -> dict[str, Any]:
        """Mode, ranks, device and the GPUs of this machine."""
        cuda = torch.cuda.is_available()
        count = self.machine.cuda_count
        return self.strategy.describe() | {
            "notes": list(self.notes),
            "device_settings": self.device_settings,
            "gpu_info": {
                "device_count": count,
                "current_device": torch.cuda.current_device() if cuda and count else None,
                "devices": [torch.cuda.get_device_name(i) for i in range(count)] if cuda else [],
            },
        }

    def record_epoch(self, samples: int, seconds: float) -> None:
        """Called by the orchestrator after each epoch (this rank's numbers)."""
        t = self._throughput
        t.epochs += 1
        t.samples += samples
        t.seconds += seconds
        t.per_epoch.append(samples / seconds if seconds else 0.0)

    def get_performance_summary(self) -> dict[str, Any]:
        t = self._throughput
        rate = t.samples / t.seconds if t.seconds else 0.0
        return {
            "training_mode": self.training_mode,
            "world_size": self.strategy.world_size,
            "rank": self.strategy.rank,
            "epochs": t.epochs,
            "samples": t.samples,
            "train_time_s": t.seconds,
            "samples_per_s": rate,
            "global_samples_per_s_estimate": rate * self.strategy.world_size,
            "samples_per_s_per_epoch": list(t.per_epoch),
        }

    def record_gpu_metrics(self) -> dict[str, Any] | None:
        """The monitor's latest sample of this rank's devices; without a running monitor,
        one taken now (NVML, or psutil on a machine without GPUs)."""
        if self.gpu_monitor is not None:
            return self.gpu_monitor.get_latest_metrics()
        monitor = GPUMonitor(device_indices=self.strategy.device_indices())
        try:
            return monitor.sample()
        finally:
            monitor.close()

    def cleanup(self) -> None:
        """Tear down what setup created (a process group this trainer did not create stays)."""
        if self._ready:
            self.strategy.teardown()
            self._ready = False


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

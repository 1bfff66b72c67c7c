"""``Distribution``: where a run trains (one device, DataParallel, DDP or FSDP2): the strategy
chosen for this machine, the model wrapped for it, the loaders sharded over the ranks, and the
training throughput counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from core.data.loader import create_dataloader
from core.distributed.config import MultiGPUConfig
from core.distributed.selection import Machine, StrategyOptions, build_strategy, resolve_mode
from core.hardware.device import device_of

__all__ = ("Distribution", "Machine")

_log = structlog.get_logger("core")


@dataclass
class _Throughput:
    epochs: int = 0
    samples: int = 0
    seconds: float = 0.0
    per_epoch: list[float] = field(default_factory=list)


class Distribution:
    """A run's distribution: resolves the mode, owns the strategy and its process group,
    wraps the model, shards the loaders and counts the training throughput."""

    def __init__(
        self,
        config: MultiGPUConfig | None = None,
        *,
        use_distributed_sampler: bool = True,
        seed: int = 0,
        machine: Machine | None = None,
    ) -> None:
        self.config = config or MultiGPUConfig()
        self.machine = machine or Machine.detect()
        self.training_mode, self.notes = resolve_mode(self.config, self.machine)
        options = StrategyOptions(use_distributed_sampler, seed)
        self.strategy = build_strategy(self.training_mode, self.config, self.machine, options)
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
            self._ready = True

    def initialize_training(
        self, model: nn.Module, compute_dtype: torch.dtype = torch.float32
    ) -> nn.Module:
        self.setup()
        return self.strategy.wrap_model(model, compute_dtype=compute_dtype)

    def prepare_loader(self, loader: Iterable[Any], *, train: bool) -> Iterable[Any]:
        """This rank's loader, re-sharded under DDP/FSDP2 (call on every rank: uneven
        ``val_loader`` lengths raise :class:`~core.errors.UnevenLoadersError` here)."""
        return self.strategy.prepare_loader(loader, train=train)

    def setup_dataloader(
        self, dataset: Dataset[Any], batch_size: int, *, shuffle: bool = True, **kwargs: Any
    ) -> DataLoader[Any]:
        """:func:`~core.data.create_dataloader` for ``dataset``, under DDP/FSDP2 with this
        rank's DistributedSampler."""
        strategy = self.strategy
        local_ranks = self.machine.env.local_world_size if self.machine.env else 1
        if strategy.world_size > 1 or self.training_mode in ("distributed", "fsdp"):
            sampler: DistributedSampler[Any] = DistributedSampler(
                dataset,
                strategy.world_size,
                strategy.rank,
                shuffle=shuffle,
                seed=kwargs.pop("seed", 0),
            )
            return create_dataloader(
                dataset,
                batch_size,
                sampler=sampler,
                device=strategy.device,
                world_size=local_ranks,
                **kwargs,
            )
        return create_dataloader(
            dataset, batch_size, shuffle=shuffle, device=strategy.device, **kwargs
        )

    def get_training_info(self) -> dict[str, Any]:
        cuda = torch.cuda.is_available()
        count = self.machine.cuda_count
        return self.strategy.describe() | {
            "notes": list(self.notes),
            "gpu_info": {
                "device_count": count,
                "current_device": torch.cuda.current_device() if cuda and count else None,
                "devices": [torch.cuda.get_device_name(i) for i in range(count)] if cuda else [],
            },
        }

    def record_epoch(self, samples: int, seconds: float) -> None:
        """Count one epoch's training samples and seconds (this rank's)."""
        t = self._throughput
        t.epochs += 1
        t.samples += samples
        t.seconds += seconds
        t.per_epoch.append(samples / seconds if seconds else 0.0)

    def merge_throughput(self, other: Distribution) -> None:
        t, o = self._throughput, other._throughput
        t.epochs += o.epochs
        t.samples += o.samples
        t.seconds += o.seconds
        t.per_epoch.extend(o.per_epoch)

    def get_performance_summary(self) -> dict[str, Any]:
        """This rank's training throughput (samples/s of training time), and
        ``memory_efficiency``: the peak memory torch allocated (since the last peak reset)
        over the device's total; None without CUDA."""
        t = self._throughput
        rate = t.samples / t.seconds if t.seconds else 0.0
        efficiency, note = _memory_efficiency(self.device)
        return {
            "training_mode": self.training_mode,
            "world_size": self.strategy.world_size,
            "rank": self.strategy.rank,
            "epochs": t.epochs,
            "samples": t.samples,
            "train_time_s": t.seconds,
            "samples_per_s": rate,
            "throughput": rate,
            "global_samples_per_s_estimate": rate * self.strategy.world_size,
            "samples_per_s_per_epoch": list(t.per_epoch),
            "memory_efficiency": efficiency,
            "memory_efficiency_note": note,
        }

    def cleanup(self) -> None:
        """Tear down what setup created (a process group it did not create stays)."""
        if self._ready:
            self.strategy.teardown()
            self._ready = False


def _memory_efficiency(device: torch.device) -> tuple[float | None, str]:
    """Peak allocated / total memory of ``device`` (allocator counters: no sync), and a note."""
    peak = device_of(device).max_allocated()
    if peak is None:
        return None, "no CUDA device: torch keeps no allocation counters for host memory"
    total = torch.cuda.get_device_properties(device).total_memory
    return peak / total, "peak memory allocated by torch / the device's total memory"

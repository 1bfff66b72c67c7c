"""Re-sharding a user's DataLoader across ranks, as Lightning and Accelerate do.

Training shards are padded to equal length (every rank, the same steps and windows).
Evaluation shards know how many samples are real: the padding is dropped from the metrics,
while every rank still runs the same forward passes (FSDP2 needs that).
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import Any, cast

import structlog
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from core.errors import ConfigError

__all__ = ("EvalShardSampler", "shard_loader")

_log = structlog.get_logger("core")


class EvalShardSampler(DistributedSampler[Any]):
    """Unshuffled, padded shard whose first :attr:`real_num_samples` samples are real."""

    @property
    def real_num_samples(self) -> int:
        return len(range(self.rank, len(cast(Sized, self.dataset)), self.num_replicas))


def shard_loader(
    loader: Iterable[Any], *, rank: int, world_size: int, train: bool, seed: int
) -> tuple[Iterable[Any], bool]:
    """Return ``(loader for this rank, whether every rank's shard has equal windows)``."""
    if not isinstance(loader, DataLoader):
        _log.warning(
            "loader_not_sharded",
            reason="not a torch DataLoader: every rank iterates all of it",
            fix="shard it per rank yourself, or pass a DataLoader",
        )
        return loader, False
    if isinstance(loader.dataset, IterableDataset):
        _log.warning(
            "loader_not_sharded",
            reason="IterableDataset: core cannot insert a sampler",
            fix="yield a different shard on each rank (torch.distributed.get_rank())",
        )
        return loader, False
    if isinstance(loader.sampler, DistributedSampler):
        return loader, False  # already sharded by the user
    if type(loader.batch_sampler) is not BatchSampler or not isinstance(
        loader.sampler, (RandomSampler, SequentialSampler)
    ):
        raise ConfigError(
            f"cannot re-shard a DataLoader with sampler {type(loader.sampler).__name__} and "
            f"batch_sampler {type(loader.batch_sampler).__name__}; allowed: the default "
            "sequential or shuffled sampling. Fix: pass use_distributed_sampler=False and "
            "give each rank its own shard."
        )
    shuffle = isinstance(loader.sampler, RandomSampler)
    sampler: DistributedSampler[Any] = (
        DistributedSampler(loader.dataset, world_size, rank, shuffle=shuffle, seed=seed)
        if train
        else EvalShardSampler(loader.dataset, world_size, rank, shuffle=False)
    )
    workers = loader.num_workers
    rebuilt = DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if workers else None,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
    )
    return rebuilt, True

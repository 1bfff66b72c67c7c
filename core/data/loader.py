"""Building a ``torch.utils.data.DataLoader`` from a :class:`LoaderConfig`: how many worker
processes, pinned memory on CUDA only, and workers seeded reproducibly.

Example::

    loader = create_dataloader(dataset, 64, shuffle=True, device=torch.device("cuda"))
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from core.checks import check_bool, is_int
from core.data.config import LoaderConfig
from core.errors import config_error

__all__ = ("auto_num_workers", "create_dataloader", "seed_worker", "usable_cores")

# Caps on auto workers. A CUDA run's training process mostly launches kernels, so workers
# may take every core but its own; past ~8 the input pipeline rarely gets faster while each
# worker still costs a process, a view of the dataset and its prefetched batches. A CPU run's
# model needs the cores itself (intra-op threads), so workers get at most half of them.
_CUDA_MAX_WORKERS = 8
_CPU_MAX_WORKERS = 4
# DataLoader keywords that LoaderConfig owns: given directly, they override the config.
_CONFIG_KWARGS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one).

    >>> usable_cores() >= 1
    True
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def auto_num_workers(
    device: torch.device | str, *, world_size: int = 1, cores: int | None = None
) -> int:
    """The number of loader workers ``num_workers=-1`` means for one training process.

    Of each local rank's share of the usable cores (:func:`usable_cores`, or ``cores``), one
    stays with the training process (``0`` workers on a single core); on CUDA the rest, at
    most 8; on CPU half the share, at most 4 (2 cores: 1 worker; 16: 8 on CUDA, 4 on CPU).

    >>> auto_num_workers(torch.device("cpu")) <= max(1, usable_cores() // 2)
    True
    """
    if not (is_int(world_size) and world_size >= 1):
        raise config_error(
            "world_size", world_size, "an integer >= 1 (training processes on this machine)"
        )
    if cores is not None and not (is_int(cores) and cores >= 1):
        raise config_error("cores", cores, "None (this process' usable cores) or an integer >= 1")
    share = (usable_cores() if cores is None else cores) // world_size
    if share <= 1:
        return 0
    if torch.device(device).type == "cuda":
        return min(share - 1, _CUDA_MAX_WORKERS)
    return min(share // 2, _CPU_MAX_WORKERS)


def seed_worker(worker_id: int) -> None:
    """Seed Python's ``random`` and NumPy's global generator in a DataLoader worker from
    torch's worker seed (PyTorch's reproducibility recipe), so augmentations written with
    either differ between workers and repeat between runs with the same seed.

    Example::

        DataLoader(dataset, num_workers=2, worker_init_fn=seed_worker)
    """
    seed = torch.initial_seed()
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:  # NumPy is optional
        return
    np.random.seed(seed % 2**32)


class _WorkerInit:
    """A picklable ``worker_init_fn`` (spawned workers unpickle it): :func:`seed_worker`,
    then the user's own ``worker_init_fn`` if one was given."""

    def __init__(self, then: Callable[[int], None] | None) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        seed_worker(worker_id)
        if self.then is not None:
            self.then(worker_id)


def _check_arguments(
    dataset: Dataset[Any],
    batch_size: object,
    shuffle: object,
    drop_last: object,
    sampler: object,
    kwargs: dict[str, Any],
) -> None:
    if not (is_int(batch_size) and batch_size >= 1):
        raise config_error(
            "batch_size",
            batch_size,
            "an integer >= 1 (samples per batch)",
            "pass the per-process batch size, e.g. batch_size=32.",
        )
    check_bool("shuffle", shuffle)
    check_bool("drop_last", drop_last)
    if sampler is not None and shuffle:
        raise config_error(
            "shuffle",
            shuffle,
            "False when a sampler is given (the sampler sets the order)",
            "drop shuffle=True; let the sampler shuffle (e.g. DistributedSampler(shuffle=True)).",
        )
    if "batch_sampler" in kwargs:
        raise config_error(
            "batch_sampler",
            kwargs["batch_sampler"],
            "None: create_dataloader batches samples by batch_size",
            "pass sampler= for the order of samples, or build the DataLoader yourself.",
        )
    if isinstance(dataset, IterableDataset) and (shuffle or sampler is not None):
        raise config_error(
            "shuffle" if shuffle else "sampler",
            shuffle if shuffle else sampler,
            "shuffle=False and sampler=None for an IterableDataset (it sets its own order)",
            "shuffle inside the dataset's __iter__.",
        )


def _resolve_workers(
    config: LoaderConfig, dataset: Dataset[Any], device: torch.device, world_size: int
) -> int:
    auto = auto_num_workers(device, world_size=world_size)  # validates world_size too
    if config.num_workers != -1:
        return config.num_workers
    if isinstance(dataset, IterableDataset):
        # Every worker runs the whole __iter__: unless the dataset shards itself with
        # get_worker_info(), workers would repeat each sample. core cannot tell, so auto
        # stays in-process; a dataset that shards asks for workers with num_workers=N.
        return 0
    return auto


def create_dataloader(
    dataset: Dataset[Any],
    batch_size: int,
    *,
    shuffle: bool = False,
    device: torch.device | str | None = None,
    config: LoaderConfig | None = None,
    drop_last: bool = False,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    sampler: Sampler[Any] | None = None,
    generator: torch.Generator | None = None,
    world_size: int = 1,
    **dataloader_kwargs: Any,
) -> DataLoader[Any]:
    """A plain ``DataLoader`` for ``dataset``, configured by ``config`` for ``device``.

    ``device`` is where batches will be used (``None``: the CPU); it decides pinned memory
    and the auto worker count. ``world_size`` is the number of training processes on this
    machine, which share its cores. ``num_workers``, ``pin_memory``, ``persistent_workers``
    and ``prefetch_factor`` may also be given as keywords: they override ``config``'s
    fields. Any other keyword (``timeout``, ``multiprocessing_context``,
    ``worker_init_fn``...) goes to the ``DataLoader``; a ``worker_init_fn`` runs after each
    worker was seeded (:func:`seed_worker`). ``persistent_workers`` and ``prefetch_factor``
    apply only with workers (torch rejects them without).

    >>> data = torch.utils.data.TensorDataset(torch.arange(10.0))
    >>> loader = create_dataloader(data, 4, config=LoaderConfig(num_workers=0))
    >>> [len(batch) for (batch,) in loader]
    [4, 4, 2]
    """
    place = torch.device("cpu") if device is None else torch.device(device)
    overrides = {k: dataloader_kwargs.pop(k) for k in _CONFIG_KWARGS if k in dataloader_kwargs}
    config = config if config is not None else LoaderConfig()
    if not isinstance(config, LoaderConfig):
        raise config_error("config", config, "a LoaderConfig or None", "e.g. LoaderConfig().")
    config = dataclasses.replace(config, **overrides)
    _check_arguments(dataset, batch_size, shuffle, drop_last, sampler, dataloader_kwargs)
    workers = _resolve_workers(config, dataset, place, world_size)
    with_workers: dict[str, Any] = {}
    if workers > 0:
        with_workers = {
            "persistent_workers": config.persistent_workers,
            "prefetch_factor": config.prefetch_factor,
        }
    init = _WorkerInit(dataloader_kwargs.pop("worker_init_fn", None))
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_fn,
        pin_memory=config.pins_memory(place),
        drop_last=drop_last,
        worker_init_fn=init,
        generator=generator,
        **with_workers,
        **dataloader_kwargs,
    )

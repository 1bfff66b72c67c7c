"""Keeping the deterministic part of sample preparation in memory: ``CachedDataset`` runs
``cache_transform`` (decode, resize) once per index and ``augment`` on every access.

Example::

    data = CachedDataset(images, cache_transform=decode_and_resize, augment=random_flip)
    data.warm()  # fill in this process, before DataLoader workers start
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sized
from typing import Any, cast

import structlog
import torch
from torch.utils.data import Dataset, get_worker_info

from core.checks import check_bool
from core.data.batches import leaves
from core.errors import config_error

__all__ = ("CachedDataset",)

_log = structlog.get_logger("core")
_MISSING = object()


class CachedDataset(Dataset[Any]):
    """A map-style dataset whose samples are prepared once and kept in RAM.

    ``sample = augment(cache_transform(dataset[i]))``, where ``cache_transform(dataset[i])``
    is computed once per index and stored, and ``augment`` runs on every access (so a random
    augmentation differs from epoch to epoch). Either may be ``None`` (identity). ``augment``
    must return new tensors rather than change its input in place: the input is the cached
    sample, which every later epoch reads.

    **When the cache fills.** Lazily, on the first access of each index, unless
    ``eager=True`` (then :meth:`warm` runs in ``__init__``). Each DataLoader worker process
    holds its *own* copy of the dataset: entries a worker fills stay in that worker, are not
    seen by the training process or by other workers, and are lost when the worker exits
    (every epoch unless ``persistent_workers=True``; even then each worker ends up computing
    and holding the indices it was given, the whole dataset per worker under shuffling). So
    with workers, call :meth:`warm` (or pass ``eager=True``) in the training process before
    the loader's first iteration: workers then start from the full cache (forked workers
    share its tensor memory copy-on-write; spawned workers receive it through shared memory)
    and never run ``cache_transform``. A worker that fills entries logs
    ``cached_dataset_filled_in_worker`` once.

    **Memory.** The cache holds whatever ``cache_transform`` returns, for every index:
    :meth:`nbytes` says how much (keep images as ``uint8`` to hold a quarter of float32).

    >>> base = torch.utils.data.TensorDataset(torch.arange(4.0))
    >>> data = CachedDataset(base, cache_transform=lambda s: s[0] * 2, eager=True)
    >>> data[1], len(data), data.nbytes()
    (tensor(2.), 4, 16)
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        cache_transform: Callable[[Any], Any] | None = None,
        augment: Callable[[Any], Any] | None = None,
        *,
        eager: bool = False,
    ) -> None:
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise config_error(
                "dataset",
                dataset,
                "a map-style dataset (with __len__ and __getitem__)",
                "collect an IterableDataset's samples in a list first, then cache the list.",
            )
        for name, fn in (("cache_transform", cache_transform), ("augment", augment)):
            if fn is not None and not callable(fn):
                raise config_error(name, fn, "a callable taking one sample, or None")
        check_bool("eager", eager)
        self.dataset = dataset
        self.cache_transform = cache_transform
        self.augment = augment
        self._cache: dict[int, Any] = {}
        self._warned = False
        if eager:
            self.warm()

    def __len__(self) -> int:
        return len(cast(Sized, self.dataset))  # checked in __init__

    def __getitem__(self, index: int) -> Any:
        key = self._key(index)
        sample = self._cache.get(key, _MISSING)
        if sample is _MISSING:
            sample = self._fill(key)
        return sample if self.augment is None else self.augment(sample)

    @property
    def cached(self) -> int:
        """How many indices are in this process' cache."""
        return len(self._cache)

    def warm(self) -> CachedDataset:
        """Fill the cache for every index not in it yet (in this process); returns ``self``.

        >>> data = CachedDataset(torch.utils.data.TensorDataset(torch.zeros(3))).warm()
        >>> data.cached
        3
        """
        for key in range(len(self)):
            if key not in self._cache:
                self._fill(key)
        return self

    def clear(self) -> None:
        """Drop every cached sample (the next access of each index prepares it again)."""
        self._cache.clear()

    def nbytes(self) -> int:
        """Bytes held by the cache's tensors (their storages; a storage shared by several
        entries counts once), NumPy arrays and ``bytes``; Python objects' own overhead is
        not counted.

        >>> CachedDataset(torch.utils.data.TensorDataset(torch.zeros(3, 2)), eager=True).nbytes()
        24
        """
        total = 0
        storages: set[int] = set()
        for sample in self._cache.values():
            for leaf in leaves(sample):
                if isinstance(leaf, torch.Tensor):
                    storage = leaf.untyped_storage()
                    if storage.data_ptr() not in storages:
                        storages.add(storage.data_ptr())
                        total += storage.nbytes()
                elif isinstance(leaf, (bytes, bytearray)):
                    total += len(leaf)
                elif isinstance(getattr(leaf, "nbytes", None), int):
                    total += int(leaf.nbytes)
        return total

    def _key(self, index: int) -> int:
        position = operator.index(index)
        size = len(self)
        if not -size <= position < size:
            raise IndexError(f"index {index!r} is out of range for a dataset of {size} samples")
        return position % size

    def _fill(self, key: int) -> Any:
        if not self._warned and get_worker_info() is not None:
            self._warned = True  # this worker's copy: once per worker process
            _log.warning(
                "cached_dataset_filled_in_worker",
                reason="each DataLoader worker fills and keeps a cache of its own",
                fix="call CachedDataset.warm() (or pass eager=True) before iterating the loader",
            )
        sample = self.dataset[key]
        if self.cache_transform is not None:
            sample = self.cache_transform(sample)
        self._cache[key] = sample
        return sample

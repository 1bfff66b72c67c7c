"""Overlapping host-to-GPU copies with compute: ``DevicePrefetcher`` copies batch N+1 to the
device on a side CUDA stream while batch N is used.

Example::

    for inputs, targets in DevicePrefetcher(loader, torch.device("cuda")):
        ...  # already on the GPU; the copy of the next batch is under way
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from core.data.batches import tensors_of, to_device
from core.data.config import LoaderConfig
from core.data.order import LoaderWrapper
from core.hardware.device import device_of

__all__ = ("DevicePrefetcher", "prefetch_to_device")


def _indexed(device: torch.device) -> torch.device:
    """``device`` with its index, as tensors name it (``cuda:0``, never plain ``cuda``)."""
    index: int | None = device.index
    if device.type != "cuda" or index is not None:
        return device
    return torch.device("cuda", torch.cuda.current_device())


def _resident(batch: Any, device: torch.device) -> bool:
    """Whether every tensor of ``batch`` is on ``device`` already."""
    return all(tensor.device == device for tensor in tensors_of(batch))


class DevicePrefetcher(LoaderWrapper):
    """Iterate over ``loader`` with each batch already on ``device``.

    On CUDA, batch N+1 is copied on a side stream (asynchronous from pinned memory) while
    the caller uses batch N, at the cost of one extra batch of device memory; the caller's
    stream waits for the copy on the device, never the host. Batches already on ``device``
    pass through, as every batch does off CUDA. Batches are nested tuples, lists and dicts
    of tensors (``core.data.batches.to_device``); ``len()``, ``sampler``, ``batch_size`` and
    ``dataset`` are the loader's, which stays available as ``.loader``.

    >>> data = torch.utils.data.TensorDataset(torch.arange(6.0))
    >>> loader = torch.utils.data.DataLoader(data, batch_size=4)
    >>> prefetcher = DevicePrefetcher(loader, torch.device("cpu"))
    >>> len(prefetcher), prefetcher.batch_size
    (2, 4)
    """

    def __init__(self, loader: Iterable[Any], device: torch.device | str) -> None:
        self.loader = loader
        self.device = torch.device(device)
        self._cuda = device_of(self.device).is_cuda

    def __len__(self) -> int:
        length = getattr(self.loader, "__len__", None)
        if length is None:
            raise TypeError(f"the wrapped {type(self.loader).__name__} has no len()")
        return int(length())

    def __iter__(self) -> Iterator[Any]:
        if not self._cuda:
            return iter(self.loader)
        return self._cuda_batches()

    def _cuda_batches(self) -> Iterator[Any]:
        device = _indexed(self.device)
        side = torch.cuda.Stream(device=device)
        batches = iter(self.loader)

        def start_copy() -> tuple[bool, tuple[Any, bool]]:
            try:
                batch = next(batches)
            except StopIteration:
                return False, (None, False)
            if _resident(batch, device):
                return True, (batch, False)  # a cached dataset's batch: as it is
            with torch.cuda.stream(side):
                return True, (to_device(batch, device), True)

        more, upcoming = start_copy()
        while more:
            batch, copied = upcoming
            if copied:  # else already on the device: no stream to wait for, nothing to mark
                consumer = torch.cuda.current_stream(device)
                consumer.wait_stream(side)  # queued on the GPU; the host does not wait
                for tensor in tensors_of(batch):
                    if tensor.is_cuda:
                        # Kernels queued on the consumer's stream may still read it: the
                        # allocator must not hand its memory to another tensor before.
                        tensor.record_stream(consumer)
            more, upcoming = start_copy()  # overlaps with the caller's use of `batch`
            yield batch


def prefetch_to_device(
    loader: Iterable[Any], device: torch.device | str, config: LoaderConfig | None = None
) -> Iterable[Any]:
    """``loader`` wrapped in a :class:`DevicePrefetcher` when ``config.device_prefetch``
    resolves to on for ``device`` (``"auto"``: CUDA only), else ``loader`` itself.

    >>> loader = [torch.zeros(2)]
    >>> prefetch_to_device(loader, torch.device("cpu")) is loader
    True
    """
    place = torch.device(device)
    config = config if config is not None else LoaderConfig()
    return DevicePrefetcher(loader, place) if config.prefetches_to(place) else loader

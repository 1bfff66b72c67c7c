"""The data section of the config tree: ``DataConfig``, how a run's loaders are fed, and its
``LoaderConfig``, how a DataLoader is built.

Example::

    LoaderConfig(num_workers=4, pin_memory="auto", device_prefetch=False)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from core.checks import check_bool_fields, is_int
from core.errors import config_error
from core.flat_keyword import flat

__all__ = ("DataConfig", "LoaderConfig")


def _check_auto_or_bool(field: str, value: object) -> None:
    if value != "auto" and not isinstance(value, bool):
        raise config_error(
            field, value, ("auto", True, False), f"pass {field}='auto' to let core choose."
        )


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """How :func:`~core.data.create_dataloader` builds a ``torch.utils.data.DataLoader``.

    ``num_workers`` (default ``-1``: auto, see :func:`~core.data.auto_num_workers`): worker
    processes that load and collate batches while the model computes. Each costs a process
    start per epoch (once with ``persistent_workers``), a copy-on-write view of the dataset
    and ``prefetch_factor`` batches of memory; ``0`` loads in the training process.

    ``pin_memory`` (default ``"auto"``: on when the target device is CUDA): collate into
    page-locked host memory so host-to-GPU copies run asynchronously. Costs a host-side copy
    per batch and locked RAM; never used off CUDA, where it buys nothing (``True`` there is
    ignored).

    ``persistent_workers`` (default ``True``): keep the workers alive between epochs instead
    of starting them again (saves the start-up, and keeps a worker's in-memory state such as
    a lazily filled cache). Costs the workers' memory between epochs, validation included.
    Only meaningful with workers.

    ``prefetch_factor`` (default ``None``: torch's ``2`` when there are workers): batches each
    worker loads ahead. Costs that many batches of host memory per worker; ignored without
    workers.

    ``device_prefetch`` (default ``"auto"``: on for CUDA, off on CPU): wrap the loader in a
    :class:`~core.data.DevicePrefetcher` that copies the next batch to the GPU on a side
    stream while the current one is used. Costs one extra batch of device memory.
    """

    num_workers: int = -1
    pin_memory: Literal["auto"] | bool = "auto"
    persistent_workers: bool = True
    prefetch_factor: int | None = None
    device_prefetch: Literal["auto"] | bool = field(
        default="auto", metadata=flat("device_prefetch")
    )

    def __post_init__(self) -> None:
        check_bool_fields(self)
        if not (is_int(self.num_workers) and self.num_workers >= -1):
            raise config_error(
                "num_workers",
                self.num_workers,
                "-1 (auto) or an integer >= 0 (0 loads in the training process)",
                "pass num_workers=-1 to let core choose from the usable CPU cores.",
            )
        if self.prefetch_factor is not None and not (
            is_int(self.prefetch_factor) and self.prefetch_factor >= 1
        ):
            raise config_error(
                "prefetch_factor",
                self.prefetch_factor,
                "None (torch's default, 2) or an integer >= 1",
                "pass prefetch_factor=None unless a profile shows workers falling behind.",
            )
        _check_auto_or_bool("pin_memory", self.pin_memory)
        _check_auto_or_bool("device_prefetch", self.device_prefetch)

    def pins_memory(self, device: torch.device) -> bool:
        """Whether batches are collated into pinned memory for ``device`` (CUDA only)."""
        return device.type == "cuda" and self.pin_memory is not False

    def prefetches_to(self, device: torch.device) -> bool:
        """Whether the loader is wrapped in a ``DevicePrefetcher`` for ``device``."""
        if self.device_prefetch == "auto":
            return device.type == "cuda"
        return bool(self.device_prefetch)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """How loaders are fed. ``use_distributed_sampler``: under DDP/FSDP2 a plain DataLoader
    is rebuilt with a DistributedSampler (off: each rank's loader is used as given).
    ``rebuild_loaders``: a run's own DataLoader left at ``num_workers=0`` over a map-style
    dataset that pickles (not a TensorDataset) is rebuilt with ``loader``'s workers,
    prefetch and pinned memory, same order (off: loaders run as given; ``run_start``'s
    ``loaders`` says what was applied). ``loader``: how :func:`~core.data.create_dataloader`
    builds loaders, and a run rebuilds them; its ``device_prefetch`` applies to a run's."""

    use_distributed_sampler: bool = field(default=True, metadata=flat("use_distributed_sampler"))
    rebuild_loaders: bool = field(default=True, metadata=flat("rebuild_loaders"))
    loader: LoaderConfig = field(default_factory=LoaderConfig)

    def __post_init__(self) -> None:
        check_bool_fields(self)
        if not isinstance(self.loader, LoaderConfig):
            raise config_error("loader", self.loader, "a LoaderConfig")

"""Feeding the model: DataLoaders built from a :class:`LoaderConfig` (auto worker count,
pinned memory on CUDA, seeded workers), batches copied to the GPU ahead of use
(:class:`DevicePrefetcher`) and datasets whose deterministic preparation is cached in RAM
(:class:`CachedDataset`).

Example::

    data = CachedDataset(images, cache_transform=decode_and_resize, augment=random_flip).warm()
    loader = create_dataloader(data, 64, shuffle=True, device=device, config=LoaderConfig())
    for inputs, targets in prefetch_to_device(loader, device):
        ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from core.data.cache import CachedDataset
    from core.data.config import LoaderConfig
    from core.data.loader import auto_num_workers, create_dataloader, seed_worker, usable_cores
    from core.data.prefetch import DevicePrefetcher, prefetch_to_device

__all__ = (
    "CachedDataset",
    "DevicePrefetcher",
    "LoaderConfig",
    "auto_num_workers",
    "create_dataloader",
    "prefetch_to_device",
    "seed_worker",
    "usable_cores",
)

# Each name's module loads when first asked for: importing one module of this package
# (a run imports a few) loads none of the others.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CachedDataset": "core.data.cache",
        "DevicePrefetcher": "core.data.prefetch",
        "LoaderConfig": "core.data.config",
        "auto_num_workers": "core.data.loader",
        "create_dataloader": "core.data.loader",
        "prefetch_to_device": "core.data.prefetch",
        "seed_worker": "core.data.loader",
        "usable_cores": "core.data.loader",
    },
)

"""A user's own DataLoader given :class:`LoaderConfig`'s workers (founding document 001's
parallel loading), re-instantiated as Lightning re-instantiates one to change its sampler:
only where that is safe, saying what was applied, or why the loader runs as given.

Example::

    loader, applied = rebuild_loader(loader, LoaderConfig(), device=torch.device("cuda"))
"""

from __future__ import annotations

import io
import multiprocessing
import pickle
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from core.data.config import LoaderConfig
from core.data.loader import _WorkerInit, auto_num_workers

__all__ = ("rebuild_loader",)

# torch's default when there are workers, written out so that run_start states it.
_PREFETCH_FACTOR = 2
# Workers are forked where the OS can: started otherwise (spawn, or the fork server of a
# training process, whose children inherit its start method) each worker imports torch and
# the program again, seconds at every epoch's start.
_FORK = "fork"


def rebuild_loader(
    loader: Iterable[Any],
    config: LoaderConfig,
    *,
    device: torch.device,
    world_size: int = 1,
) -> tuple[Iterable[Any], dict[str, Any]]:
    """``loader`` rebuilt with ``config``'s workers, prefetch and pinned memory where it is a
    plain ``DataLoader`` left at ``num_workers=0`` over a map-style dataset that pickles, and
    what was applied (``rebuilt``, the settings) or why not (``rebuilt: False``, ``reason``).

    The rebuilt loader keeps the given sampler objects and generator, so its order, and a
    resume's, are the given loader's. Its workers are not persistent: torch draws their seeds
    at each epoch's start only without, so a resumed run draws what an uninterrupted one does.
    """
    if type(loader) is not DataLoader:
        # A subclass may take other arguments or override iteration: core cannot rebuild it.
        return loader, {"rebuilt": False, "reason": f"a {type(loader).__name__}, not a DataLoader"}
    why = _kept_as_given(loader, config, device, world_size)
    if why is not None:
        return loader, {"rebuilt": False, "reason": why}
    workers = _workers(config, device, world_size)
    pin = config.pins_memory(device)
    prefetch = config.prefetch_factor or _PREFETCH_FACTOR
    rebuilt = DataLoader(
        loader.dataset,
        **_batching(loader),
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=pin,
        timeout=loader.timeout,
        worker_init_fn=_WorkerInit(loader.worker_init_fn),  # seeds random and NumPy too
        multiprocessing_context=loader.multiprocessing_context or _FORK,
        generator=loader.generator,  # the workers' seeds: drawn as the given loader draws
        prefetch_factor=prefetch,
        persistent_workers=False,
        in_order=loader.in_order,
    )
    applied = {
        "rebuilt": True,
        "num_workers": workers,
        "prefetch_factor": prefetch,
        "pin_memory": pin,
        "persistent_workers": False,
        "start_method": rebuilt.multiprocessing_context.get_start_method(),
    }
    return rebuilt, applied


def _kept_as_given(
    loader: DataLoader[Any], config: LoaderConfig, device: torch.device, world_size: int
) -> str | None:
    """Why ``loader`` runs as given, in words; None where it is rebuilt."""
    dataset = loader.dataset
    if loader.num_workers > 0:
        return f"num_workers={loader.num_workers} was set on the loader"
    if isinstance(dataset, IterableDataset):
        return "an IterableDataset: each worker would repeat its __iter__"
    if isinstance(dataset, TensorDataset):
        # Its batches are slices of tensors already in memory: workers would only add a
        # pipe between them and the model.
        return "a TensorDataset: nothing to load in parallel"
    if _workers(config, device, world_size) == 0:
        return "data.loader.num_workers resolves to 0 on this machine"
    if (
        loader.multiprocessing_context is None
        and _FORK not in multiprocessing.get_all_start_methods()
    ):
        return "workers cannot be forked here: each would import the program at every epoch"
    return _unpicklable(loader)


def _workers(config: LoaderConfig, device: torch.device, world_size: int) -> int:
    if config.num_workers == -1:
        return auto_num_workers(device, world_size=world_size)
    return config.num_workers


def _batching(loader: DataLoader[Any]) -> dict[str, Any]:
    """The given loader's batching, with its own sampler objects (their generators are what a
    checkpoint restores)."""
    batch_sampler = loader.batch_sampler
    if batch_sampler is None:  # batch_size=None: the sampler's items are the batches
        return {"batch_size": None, "sampler": loader.sampler}
    if loader.batch_size is not None:  # built from batch_size: a BatchSampler over sampler
        return {
            "batch_size": loader.batch_size,
            "sampler": loader.sampler,
            "drop_last": loader.drop_last,
        }
    return {"batch_sampler": batch_sampler}  # the user's own, with its sampler inside


class _Discard(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return len(data)


class _ReferencesOnly(pickle.Pickler):
    """Pickles into nothing; arrays and tensors (which always pickle) are not copied."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) or type(obj).__module__ == "numpy":
            return id(obj)
        return None


def _unpicklable(loader: DataLoader[Any]) -> str | None:
    """Why workers cannot receive what they run, or None. Checked whatever the start method:
    what pickles holds no lock, open file, socket or event loop a forked worker would copy."""
    parts = {
        "dataset": loader.dataset,
        "collate_fn": loader.collate_fn,
        "worker_init_fn": loader.worker_init_fn,
    }
    for name, part in parts.items():
        try:
            _ReferencesOnly(_Discard()).dump(part)
        except Exception as exc:  # pickle raises many kinds (TypeError, PicklingError, ...)
            return f"its {name} does not pickle ({type(exc).__name__}: {exc})"
    return None

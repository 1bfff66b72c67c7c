"""What decides the order of a train loader's batches, as a checkpoint captures it.
:class:`LoaderOrder` captures and restores the loader's own generators (torch's global one is
``core.rng``'s), and says where a resume cannot restore the order (an ``IterableDataset``, an
opaque sampler, persistent workers after the first epoch).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = ("LoaderOrder", "LoaderWrapper")

# Loader attributes read through a wrapper (a distributed strategy calls
# ``loader.sampler.set_epoch``; the step reads ``batch_size``).
_DELEGATED = frozenset({"batch_sampler", "batch_size", "dataset", "drop_last", "sampler"})

# torch's samplers: their order comes from their ``generator`` (or the global one), or from
# ``seed`` and ``set_epoch`` (DistributedSampler), all of which a checkpoint restores.
_KNOWN_SAMPLERS = (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)


class LoaderWrapper:
    """One of core's loader wrappers (a batch limit, the device prefetcher): its batches are
    ``.loader``'s, in its order, and the loader's sampler, batch size and dataset are read
    through it."""

    loader: Iterable[Any]

    def __getattr__(self, name: str) -> Any:
        # Only called for names not found on the wrapper itself.
        loader = self.__dict__.get("loader")
        if name in _DELEGATED and loader is not None:
            return getattr(loader, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class LoaderOrder:
    """The torch generators ``loader`` draws its order from (looking through
    :class:`LoaderWrapper`), and what a resume cannot restore."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        inner = loader
        while isinstance(inner, LoaderWrapper):
            inner = inner.loader
        self._inner = inner
        self.generators = _generators(inner)
        """The loader's, its sampler's and its batch sampler's own generators, each once."""

    def capture(self) -> list[torch.Tensor]:
        """The state of each of :attr:`generators` (byte tensors: ``weights_only`` loads them)."""
        return [generator.get_state() for generator in self.generators]

    def restore(self, states: Sequence[torch.Tensor] | None) -> None:
        """Put back what :meth:`capture` returned. None (a checkpoint from before loader
        generators were saved), or states of another number of generators (the loader was
        given other generators since), restore nothing."""
        if states is None or len(states) != len(self.generators):
            return
        for generator, state in zip(self.generators, states, strict=True):
            generator.set_state(state)

    def unrestorable(self, *, epoch: int) -> str | None:
        """Why a run resumed in ``epoch`` may draw other batches than one never stopped, in
        words; None where every source of the order is restored."""
        loader = self._inner
        if isinstance(loader, (list, tuple)):
            return None  # a fixed sequence: replayed, the same batches
        if not isinstance(loader, DataLoader):
            return (
                f"the train loader is a {type(loader).__name__}, not a DataLoader or a list: "
                "core restores torch's, Python's and NumPy's global generators and replays the "
                "epoch from its start, skipping the batches already trained on, which lands on "
                "the same batches only if it yields them in the same order again"
            )
        if isinstance(loader.dataset, IterableDataset):
            return (
                f"the train loader's dataset is an IterableDataset "
                f"({type(loader.dataset).__name__}), which sets its own order: core replays the "
                "epoch from its start, skipping the batches already trained on, which lands on "
                "the same batches only if its __iter__ yields them in the same order again "
                "(drawing only from torch's, Python's or NumPy's global generators)"
            )
        for sampler in _samplers(loader):
            if not _restored(sampler):
                return (
                    f"the train loader's sampler {type(sampler).__name__} is not one of "
                    "torch's and has neither a generator nor set_epoch(): core cannot see "
                    "what it draws its order from. Fix: give it a torch.Generator as "
                    "self.generator, or a set_epoch(epoch) that seeds its order"
                )
        if epoch > 0 and loader.num_workers > 0 and loader.persistent_workers:
            return (
                "the train loader has persistent_workers=True: an uninterrupted run draws its "
                "workers' seeds once, in its first epoch, while a run resumed in a later "
                "epoch draws them again from the generator its shuffle draws from, so the "
                "shuffle and the workers' random draws differ. Fix: persistent_workers=False"
            )
        return None


def _samplers(loader: DataLoader[Any]) -> list[object]:
    """The loader's sampler, its batch sampler and the sampler that one wraps."""
    batch_sampler = loader.batch_sampler
    inner = getattr(batch_sampler, "sampler", None)
    return [s for s in (loader.sampler, batch_sampler, inner) if s is not None]


def _restored(sampler: object) -> bool:
    """Whether a checkpoint restores what ``sampler`` draws its order from."""
    if type(sampler) in _KNOWN_SAMPLERS:
        return True
    generator = getattr(sampler, "generator", False)  # None: draws from the global one
    if generator is None or isinstance(generator, torch.Generator):
        return True
    return callable(getattr(sampler, "set_epoch", None))  # ordered by the epoch core sets


def _generators(loader: object) -> list[torch.Generator]:
    """The distinct torch generators of ``loader``, its samplers (in a fixed order)."""
    owners = [loader]
    if isinstance(loader, DataLoader):
        owners += _samplers(loader)
    found: list[torch.Generator] = []
    for owner in owners:
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(g is not generator for g in found):
            found.append(generator)
    return found

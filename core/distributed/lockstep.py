"""Keeping ranks in step when their loaders differ in length. Every DDP/FSDP2 step is a
collective: a rank that ends its epoch early crashes gloo or hangs NCCL. Exact lengths are
compared once; streams are agreed on before every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

import structlog
from torch.utils.data import DataLoader, IterableDataset

from core.errors import UnevenLoadersError

__all__ = ("Lockstep", "LockstepLoader", "StreamLockstep", "batches_in", "uneven_loaders_error")

_log = structlog.get_logger("core")
_END = object()


def batches_in(loader: Iterable[Any]) -> int | None:
    """``len(loader)`` where it is exact; None for a stream (an ``IterableDataset``'s
    ``len()`` is an estimate)."""
    if isinstance(loader, DataLoader) and isinstance(loader.dataset, IterableDataset):
        return None
    if not isinstance(loader, Sized):
        return None
    try:
        return len(loader)
    except TypeError:  # a DataLoader whose dataset has no __len__
        return None


def uneven_loaders_error(name: str, lengths: list[int], epoch: int | None) -> UnevenLoadersError:
    """The error every rank raises when its peers' ``name`` loaders differ in length."""
    per_rank = ", ".join(f"rank {rank}: {n}" for rank, n in enumerate(lengths))
    when = (
        "when the optimizer was built, before training"
        if epoch is None
        else f"at the start of epoch {epoch}, before its first step"
    )
    return UnevenLoadersError(
        f"{name} holds a different number of batches on each rank ({per_rank}), found {when}; "
        "allowed: the same number on every rank (each step is a collective that every rank "
        "joins). Fix: pass use_distributed_sampler=True "
        "so core shards one DataLoader evenly with a DistributedSampler, or give every rank "
        "the same number of batches (equal-size shards; drop_last=True drops a short last "
        "batch that only some ranks have)."
    )


class Lockstep:
    """Loaders that end together by themselves (equal lengths, or one process)."""

    agrees_each_step = False  # uneven_end is always None here: the step loop does not ask

    def uneven_end(self, in_hand: int) -> dict[str, Any] | None:
        """Before each step, with this rank's batches for it (0: none left): None while all
        go on (or all ran out); else, on every rank, an ``uneven_inputs`` record's fields."""
        return None


class StreamLockstep(Lockstep):
    """Streams of unknown length: one small all-gather before every step."""

    agrees_each_step = True

    def __init__(self, all_gather: Callable[[int], list[int]]) -> None:
        self._all_gather = all_gather

    def uneven_end(self, in_hand: int) -> dict[str, Any] | None:
        # The cost of streams: a collective per step, as a stream's end is known only once
        # reached (control-plane group; no device sync).
        counts = self._all_gather(in_hand)
        if all(counts) or not any(counts):
            return None
        return {
            "exhausted_ranks": [rank for rank, n in enumerate(counts) if n == 0],
            # At least: a stream is not read further (it may be endless); these batches were
            # fetched for the step not taken.
            "unused_batches_at_least": counts,
        }


class LockstepLoader:
    """A stream every rank reads in step (evaluation), agreeing before each batch; it ends
    on every rank where the first one's ends (an ``uneven_inputs`` warning)."""

    def __init__(self, loader: Iterable[Any], lockstep: Lockstep, name: str) -> None:
        self.loader = loader
        self.lockstep = lockstep
        self.name = name

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.loader)
        while True:
            batch = next(batches, _END)
            uneven = self.lockstep.uneven_end(0 if batch is _END else 1)
            if uneven is not None:
                _log.warning(
                    "uneven_inputs",
                    loader=self.name,
                    **uneven,
                    fix="give every rank the same number of batches",
                )
            if batch is _END or uneven is not None:
                return
            yield batch

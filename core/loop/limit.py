"""Epochs of a loader's first batches only: ``limit_train_batches`` / ``limit_val_batches``.

A limit is applied once, where a run's loader is made (the train loader by the composition
root, the validation loader by the validation schedule), so everything that counts an
epoch's batches (the plan, progress bars, accumulation windows, resuming mid-epoch) sees the
limited loader and agrees with it::

    loader = limit_batches(DataLoader(range(100), batch_size=10), 0.25, "limit_train_batches")
    len(loader), len(list(loader))      # (2, 2)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from core.data.order import LoaderWrapper
from core.distributed.lockstep import batches_in
from core.errors import config_error

__all__ = ("Limit", "LimitedLoader", "LimitedStream", "epoch_batches", "limit_batches")

Limit = int | float | None


def epoch_batches(limit: Limit, batches: int | None, field: str) -> int | None:
    """The batches an epoch takes from a loader of ``batches`` (None: a stream, no
    ``len()``) under ``limit``; None: all the loader yields. A fraction takes
    ``int(batches * limit)`` (Lightning's rule) and must take at least one.

    >>> epoch_batches(3, 10, "limit_train_batches"), epoch_batches(0.5, 5, "limit_val_batches")
    (3, 2)
    """
    if limit is None or (isinstance(limit, float) and limit == 1.0):
        return batches
    if isinstance(limit, float):
        if batches is None:
            raise config_error(
                field,
                limit,
                "None or an integer number of batches for a loader without len() "
                "(a stream: a fraction of it is unknown)",
                f"pass {field}=N for N batches.",
            )
        taken = int(batches * limit)
        if taken < 1 and batches > 0:
            raise config_error(
                field,
                limit,
                f"a fraction of at least {1 / batches:.4g} (1 of this loader's "
                f"{batches} batches), or an integer",
                f"pass {field}=1 for one batch.",
            )
        return taken
    return limit if batches is None else min(limit, batches)


class LimitedStream(LoaderWrapper):
    """Each pass over ``loader`` stops after its first ``limit`` batches (a loader without
    ``len()``: at most that many). The batch after the last is never drawn."""

    def __init__(self, loader: Iterable[Any], limit: Limit, field: str) -> None:
        self.loader = loader
        self.limit = limit
        self.field = field

    def taken(self) -> int | None:
        """The batches a pass takes now (the loader's length may change between epochs)."""
        return epoch_batches(self.limit, batches_in(self.loader), self.field)

    def __iter__(self) -> Iterator[Any]:
        taken = self.taken()
        batches = iter(self.loader)
        return batches if taken is None else itertools.islice(batches, taken)


class LimitedLoader(LimitedStream):
    """A :class:`LimitedStream` of a loader with an exact ``len()``: its own ``len()`` is
    the limited epoch's."""

    def __len__(self) -> int:
        return self.taken() or 0


def limit_batches(loader: Iterable[Any], limit: Limit, field: str) -> Iterable[Any]:
    """``loader`` itself without a limit, else wrapped so each pass takes only ``limit``
    batches (:func:`epoch_batches`); a bad limit for this loader raises
    :class:`~core.errors.ConfigError` naming ``field`` now, before any batch is drawn."""
    if limit is None or (isinstance(limit, float) and limit == 1.0):
        return loader
    batches = batches_in(loader)
    epoch_batches(limit, batches, field)  # fails here, not in the first epoch
    kind = LimitedStream if batches is None else LimitedLoader
    return kind(loader, limit, field)

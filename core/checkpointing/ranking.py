"""The best ``k`` checkpoints by a monitored value (``save_best``, ``save_top_k``). Entries are
``[value, path]`` pairs, the best first; a later checkpoint must be strictly better to pass an
earlier one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

__all__ = ("Ranked", "WORST", "better", "offer")

Ranked = list[list[float | str]]


_SIGN = {"min": 1.0, "max": -1.0}
WORST = {"min": math.inf, "max": -math.inf}  # where a search for the best starts


def better(value: float, than: float, mode: Literal["min", "max"], margin: float = 0.0) -> bool:
    """Whether ``value`` improves on ``than`` by more than ``margin`` (shared by
    ``save_top_k`` and early stopping)."""
    sign = _SIGN[mode]
    return sign * value < sign * than - margin


def offer(
    ranked: Sequence[Sequence[float | str]],
    value: float,
    path: str,
    *,
    k: int,
    mode: Literal["min", "max"],
) -> Ranked | None:
    """The new top ``k`` (``-1``: unbounded) with ``[value, path]`` in it, or None if it
    does not enter."""
    pairs = [(float(v), str(p)) for v, p in ranked if str(p) != path]
    position = next((i for i, (v, _) in enumerate(pairs) if better(value, v, mode)), len(pairs))
    if k != -1 and position >= k:
        return None
    pairs.insert(position, (value, path))
    return [[v, p] for v, p in (pairs if k == -1 else pairs[:k])]

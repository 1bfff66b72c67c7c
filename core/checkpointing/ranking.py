"""The best ``k`` checkpoints by a monitored value (``save_best``, ``save_top_k``).

Entries are ``[value, path]`` pairs, the best first; ties keep the earlier checkpoint
ahead (a later one must be strictly better to pass it).

>>> offer([[0.5, "a"], [0.7, "b"]], 0.6, "c", k=2, mode="min")
[[0.5, 'a'], [0.6, 'c']]
>>> offer([[0.5, "a"], [0.7, "b"]], 0.8, "c", k=2, mode="min") is None
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

__all__ = ("Ranked", "better", "offer")

Ranked = list[list[float | str]]


def better(value: float, than: float, mode: Literal["min", "max"]) -> bool:
    """Whether ``value`` improves on ``than`` (lower for ``"min"``, higher for ``"max"``)."""
    return value < than if mode == "min" else value > than


def offer(
    ranked: Sequence[Sequence[float | str]], value: float, path: str, *, k: int,
    mode: Literal["min", "max"],
) -> Ranked | None:  # fmt: skip
    """The new top ``k`` (``-1``: unbounded) with ``[value, path]`` in it, or None when it
    would not enter (the list is full and it is not better than the last)."""
    pairs = [(float(v), str(p)) for v, p in ranked if str(p) != path]
    position = next((i for i, (v, _) in enumerate(pairs) if better(value, v, mode)), len(pairs))
    if k != -1 and position >= k:
        return None
    pairs.insert(position, (value, path))
    return [[v, p] for v, p in (pairs if k == -1 else pairs[:k])]

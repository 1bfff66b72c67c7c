"""The resolved configuration of a job, as written to ``config.json`` and ``run_start``."""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import Any

from torch import nn

__all__ = ("jsonable", "name_of", "parameter_count")


def jsonable(value: object) -> object:
    """Plain JSON types as they are; sequences element-wise; anything else as ``str``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return str(value)


def name_of(obj: object) -> str:
    return getattr(obj, "__name__", None) or type(obj).__name__


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def batches_per_epoch(loader: Iterable[Any]) -> int | None:
    return len(loader) if isinstance(loader, Sized) else None

"""What a run says about itself: ``config.json``, the ``run_start``/``run_end`` fields and
the fingerprint a checkpoint is checked against. Each part describes itself (its own
``describe()``); this module only assembles, so it imports none of them."""

from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping, Sized
from typing import Any, Protocol

import torch
from torch import nn

__all__ = (
    "Describable",
    "Fixed",
    "batches_per_epoch",
    "fingerprint",
    "jsonable",
    "parameter_count",
    "resolved",
    "run_end_fields",
    "run_start_fields",
)


class Describable(Protocol):
    def describe(self) -> dict[str, Any]: ...


class Fixed:
    """A description known in advance (a config section, settings already applied)."""

    def __init__(self, description: dict[str, Any]) -> None:
        self._description = description

    def describe(self) -> dict[str, Any]:
        return self._description


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
    try:
        return len(loader) if isinstance(loader, Sized) else None
    except TypeError:  # a DataLoader over an IterableDataset without __len__
        return None


def _base_lr(optimizer: torch.optim.Optimizer) -> float | str | None:
    """The learning rate the optimizer was built with (its defaults; schedules leave it)."""
    lr = optimizer.defaults.get("lr")
    return float(lr) if isinstance(lr, (int, float)) else None if lr is None else str(lr)


def fingerprint(
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: object | None,
    precision: str,
    accumulation_steps: int,
    world_size: int,
    train_loader: Iterable[Any],
) -> dict[str, Any]:
    """The settings a checkpoint's state depends on (compared before resuming)."""
    return {
        "model": type(model).__name__,
        "parameters": parameter_count(model),
        "optimizer": type(optimizer).__name__,
        "learning_rate": _base_lr(optimizer),
        "scheduler": None if scheduler is None else type(scheduler).__name__,
        "precision": precision,
        "accumulation_steps": accumulation_steps,
        "world_size": world_size,
        "batches_per_epoch": batches_per_epoch(train_loader),
        "batch_size": getattr(train_loader, "batch_size", None),
    }


def resolved(
    parts: Mapping[str, Describable],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: object | None,
    loss_fn: object,
) -> dict[str, Any]:
    """What the config resolved to: each part's own description, and the runtime objects."""
    return {name: jsonable(part.describe()) for name, part in parts.items()} | {
        "model": type(model).__name__,
        "parameters": parameter_count(model),
        "optimizer": type(optimizer).__name__,
        "optimizer_defaults": jsonable(optimizer.defaults),
        "scheduler": None if scheduler is None else type(scheduler).__name__,
        "loss_fn": name_of(loss_fn),
    }


def run_start_fields(
    config: dict[str, Any], resolved: dict[str, Any], *, device: str, precision: str, run_dir: str
) -> dict[str, Any]:
    """The ``run_start`` record: the config tree, what it resolved to, versions, device."""
    return {
        "config": config,
        "resolved": resolved,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "device": device,
        "precision": precision,
        "run_dir": run_dir,
    }


def run_end_fields(
    *,
    status: str,
    error: BaseException | None,
    events_dropped: int,
    epochs_completed: int,
    global_step: int,
    best_metric: float,
) -> dict[str, Any]:
    """The ``run_end`` record: how the run ended, where it got, and why it failed."""
    fields: dict[str, Any] = {
        "status": status,
        "epochs_completed": epochs_completed,
        "global_step": global_step,
        "best_metric": best_metric,
        "events_dropped": events_dropped,
    }
    if error is not None:
        fields["error_type"] = type(error).__name__
        fields["error"] = str(error)
    return fields

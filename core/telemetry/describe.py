"""What a run says about itself: ``config.json``, the ``run_start``/``run_end`` fields and
the fingerprint a checkpoint is checked against. Each part describes itself (its own
``describe()``); this module only assembles, so it imports none of them."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Mapping, Sized
from typing import Any, Protocol

import torch
from torch import nn

__all__ = (
    "Describable",
    "Fixed",
    "batches_per_epoch",
    "data_settings",
    "fingerprint",
    "jsonable",
    "optimizer_settings",
    "parameter_count",
    "resolved",
    "run_end_fields",
    "run_start_fields",
    "scheduler_settings",
)


class Describable(Protocol):
    def describe(self) -> dict[str, Any]: ...


class Fixed:
    """A description known in advance (a config section, settings already applied)."""

    def __init__(self, description: dict[str, Any]) -> None:
        self._description = description

    def describe(self) -> dict[str, Any]:
        return self._description


def jsonable(value: object, other: Callable[[object], object] = str) -> object:
    """``value`` as JSON types, anything else converted by ``other``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [jsonable(v, other) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v, other) for k, v in value.items()}
    return other(value)


def name_of(obj: object) -> str:
    return getattr(obj, "__name__", None) or type(obj).__name__


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def batches_per_epoch(loader: Iterable[Any]) -> int | None:
    try:
        return len(loader) if isinstance(loader, Sized) else None
    except TypeError:  # a DataLoader over an IterableDataset without __len__
        return None


# param_groups keys that are not hyperparameters: the tensors, what a scheduler adds, and
# how the update is computed (a fused or foreach kernel gives the same result).
_NOT_SETTINGS = frozenset(
    {"params", "initial_lr", "foreach", "fused", "capturable", "differentiable"}
)
_RENAMED = {"lr": "learning_rate"}
# A scheduler's state_dict entries that say where it is, not how it was set.
_SCHEDULER_PROGRESS = frozenset(
    {
        "last_epoch",
        "_step_count",
        "_last_lr",
        "_get_lr_called_within_step",
        "base_lrs",
        "best",
        "num_bad_epochs",
        "cooldown_counter",
        "_is_initial",
        "_initial_step",
    }
)


def _named(value: object) -> object:
    """A one-element tensor's number (a capturable optimizer's lr), else a type's name."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return name_of(value)


def _setting(value: object) -> object:
    return jsonable(value, _named)


def optimizer_settings(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's class and every group's hyperparameters as built, named
    ``weight_decay`` for one group and ``param_groups[1].weight_decay`` for several."""
    groups = optimizer.param_groups
    settings: dict[str, Any] = {
        "optimizer": type(optimizer).__name__,
        "param_groups": [len(group["params"]) for group in groups],
    }
    for index, group in enumerate(groups):
        prefix = "" if len(groups) == 1 else f"param_groups[{index}]."
        for key, value in group.items():
            if key not in _NOT_SETTINGS:
                built = group.get("initial_lr", value) if key == "lr" else value
                settings[prefix + _RENAMED.get(key, key)] = _setting(built)
    return settings


def scheduler_settings(scheduler: object | None) -> dict[str, Any]:
    """The scheduler's class and how it was set (its ``state_dict`` without its position)."""
    if scheduler is None:
        return {"scheduler": None}
    state_dict = getattr(scheduler, "state_dict", None)
    state = state_dict() if callable(state_dict) else {}
    return {"scheduler": type(scheduler).__name__} | {
        f"scheduler.{key}": _setting(value)
        for key, value in sorted(state.items())
        if key not in _SCHEDULER_PROGRESS
    }


def data_settings(loader: Iterable[Any]) -> dict[str, Any]:
    """What decides the order and grouping of the training batches."""
    dataset = getattr(loader, "dataset", None)
    sampler = getattr(loader, "sampler", None)
    return {
        "batches_per_epoch": batches_per_epoch(loader),
        "batch_size": getattr(loader, "batch_size", None),
        "dataset_length": len(dataset) if isinstance(dataset, Sized) else None,
        "drop_last": getattr(loader, "drop_last", None),
        "sampler": None if sampler is None else type(sampler).__name__,
    }


def fingerprint(
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: object | None,
    precision: str,
    accumulation_steps: int,
    world_size: int,
    train_loader: Iterable[Any],
    seed: int | None,
) -> dict[str, Any]:
    """The settings a checkpoint's state depends on, compared before resuming."""
    return {
        "model": type(model).__name__,
        "parameters": parameter_count(model),
        **optimizer_settings(optimizer),
        **scheduler_settings(scheduler),
        "precision": precision,
        "accumulation_steps": accumulation_steps,
        "world_size": world_size,
        **data_settings(train_loader),
        "seed": seed,
    }


def resolved(
    parts: Mapping[str, Describable],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: object | None,
    loss_fn: object,
) -> dict[str, Any]:
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

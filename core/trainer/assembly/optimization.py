"""The optimizer and the LR scheduler of a run, from what it was given: an instance, a
factory, or nothing (the default AdamW; no scheduler)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from core.config import TrainingConfig
from core.errors import config_error
from core.loop.epoch import Scheduler
from core.loop.step import default_optimizer
from core.memory.trial import OptimizerFactory
from core.trainer.assembly.arguments import (
    built_by,
    check_optimizer,
    check_scheduler,
    is_scheduler_instance,
)
from core.trainer.assembly.model_setup import optimizer_factory_like

__all__ = (
    "OptimizerArgument",
    "SchedulerArgument",
    "optimizer_for",
    "plateau_of",
    "scheduler_for",
    "trial_optimizer",
)

OptimizerArgument = torch.optim.Optimizer | Callable[[list[nn.Parameter]], torch.optim.Optimizer]
SchedulerArgument = Scheduler | Callable[[torch.optim.Optimizer], Scheduler]


def optimizer_for(
    argument: OptimizerArgument | None, model: nn.Module, config: TrainingConfig
) -> torch.optim.Optimizer:
    """The user's optimizer instance, one built by their factory, or the default AdamW."""
    params = [p for p in model.parameters() if p.requires_grad]
    if argument is None:
        return default_optimizer(params, config.optim.learning_rate, config.optim.weight_decay)
    given = isinstance(argument, torch.optim.Optimizer)
    optimizer = argument if given else built_by("optimizer", argument, params)  # type: ignore[arg-type]
    check_optimizer(optimizer, model, given=given)
    return optimizer  # type: ignore[return-value]


def trial_optimizer(argument: OptimizerArgument | None) -> OptimizerFactory | None:
    """What the batch-size trials step: a fresh optimizer like the run's (AdamW without)."""
    if argument is None or isinstance(argument, torch.optim.Optimizer):
        return optimizer_factory_like(argument)
    return argument  # the user's factory of parameters


def scheduler_for(
    argument: SchedulerArgument | None, optimizer: torch.optim.Optimizer
) -> Scheduler | None:
    """The user's scheduler instance, one built by their factory, or None."""
    if argument is None:
        return None
    scheduler = (
        argument if is_scheduler_instance(argument) else built_by("scheduler", argument, optimizer)
    )
    check_scheduler(scheduler, optimizer)
    return scheduler


def plateau_of(scheduler: object, monitor: str, mode: str) -> Any:
    """``scheduler`` when it steps with a metric (``ReduceLROnPlateau``, or any whose
    ``step`` needs an argument), else None; one whose ``mode`` is not the monitored value's
    is refused."""
    if scheduler is None or not _takes_metric(scheduler):
        return None
    own = getattr(scheduler, "mode", mode)
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) and own != mode:
        raise config_error(
            "scheduler",
            f"ReduceLROnPlateau(mode={own!r})",
            f"mode={mode!r}, the mode of the monitored value {monitor!r}",
            f"pass ReduceLROnPlateau(optimizer, mode={mode!r}), or set early_stopping.monitor "
            "and early_stopping.mode to the value it should follow.",
        )
    return scheduler


def _takes_metric(scheduler: object) -> bool:
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return True
    try:
        parameters = inspect.signature(scheduler.step).parameters.values()  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.default is p.empty and p.kind in positional for p in parameters)

"""The resolved configuration of a job, as written to ``config.json`` and ``run_start``."""

from __future__ import annotations

import platform
from collections.abc import Iterable, Sized
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from core.trainer.orchestrator import OptimizedTrainingOptimizer

__all__ = ("describe_job", "fingerprint", "jsonable", "run_end_fields", "run_start_fields")


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


def fingerprint(job: OptimizedTrainingOptimizer) -> dict[str, Any]:
    """The settings a checkpoint's state depends on (compared before resuming)."""
    model = job.strategy.unwrap(job.model)
    return {
        "model": type(model).__name__,
        "parameters": parameter_count(model),
        "optimizer": type(job.optimizer).__name__,
        "learning_rate": _base_lr(job.optimizer),
        "scheduler": None if job.scheduler is None else type(job.scheduler).__name__,
        "precision": job.mixed_precision.configured_precision,
        "accumulation_steps": job.accumulation.accumulation_steps,
        "world_size": job.strategy.world_size,
        "batches_per_epoch": batches_per_epoch(job.train_loader),
        "batch_size": getattr(job.train_loader, "batch_size", None),
    }


def describe_job(job: OptimizedTrainingOptimizer) -> dict[str, Any]:
    """What ``config.json`` and ``run_start`` hold: every resolved setting of the job."""
    model = job.strategy.unwrap(job.model)
    return {
        "training": job.config.to_dict(),
        "mixed_precision": {
            **{k: jsonable(v) for k, v in vars(job.mixed_precision.config).items()},
            "resolved_precision": job.mixed_precision.amp_precision.name,
        },
        "gradient_accumulation": vars(job.accumulation.config),
        "strategy": job.multi_gpu_trainer.get_training_info(),
        "checkpoints": {
            **{k: jsonable(v) for k, v in vars(job.checkpointer.config).items()},
            "directory": str(job.checkpointer.store.directory),
        },
        "error_handling": jsonable(vars(job.error_handler.config)),
        "model": type(model).__name__,
        "parameters": parameter_count(model),
        "optimizer": type(job.optimizer).__name__,
        "optimizer_defaults": jsonable(job.optimizer.defaults),
        "scheduler": None if job.scheduler is None else type(job.scheduler).__name__,
        "loss_fn": name_of(job.objective.loss_fn),
    }


def run_start_fields(job: OptimizedTrainingOptimizer) -> dict[str, Any]:
    """The ``run_start`` record: the resolved config, versions, device and precision."""
    return {
        "config": describe_job(job),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "device": str(job.strategy.device),
        "precision": job.mixed_precision.precision.name,
        "run_dir": str(job.run_dir),
    }


def run_end_fields(
    job: OptimizedTrainingOptimizer, status: str, error: BaseException | None, events_dropped: int
) -> dict[str, Any]:
    """The ``run_end`` record: how the run ended, where it got, and why it failed."""
    fields: dict[str, Any] = {
        "status": status,
        "epochs_completed": job.epochs_completed,
        "global_step": job.global_step,
        "best_metric": job.early_stopping.best,
        "events_dropped": events_dropped,
    }
    if error is not None:
        fields["error_type"] = type(error).__name__
        fields["error"] = str(error)
    return fields

"""``create_optimized_training_optimizer``: validate every argument, build the parts, compose.

The orchestrator itself lives in ``core.orchestrator``; both names are importable from here,
as in the seed API::

    from core.optimized_training_optimizer import create_optimized_training_optimizer

    optimizer = create_optimized_training_optimizer(
        model=model, train_loader=train_loader, val_loader=val_loader, max_epochs=3
    )
    results = await optimizer.train()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from core.checkpointing import CheckpointConfig
from core.config import TrainingConfig
from core.error_handler import ErrorHandler, ErrorHandlerConfig
from core.errors import ConfigError, EmptyLoaderError, config_error
from core.gpu_manager import GPUManagerConfig
from core.gradient_accumulation import GradientAccumulation, GradientAccumulationConfig
from core.mixed_precision_training import AmpDtype, MixedPrecisionConfig, MixedPrecisionTrainer
from core.multi_gpu_training import MultiGPUConfig, MultiGPUTrainer
from core.objective import LossFn, Objective
from core.optim_step import default_optimizer
from core.orchestrator import OptimizedTrainingOptimizer
from core.step_loop import Scheduler

__all__ = ("OptimizedTrainingOptimizer", "create_optimized_training_optimizer")

T = TypeVar("T")
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Scheduler]


def _check_model(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise config_error("model", model, "a torch.nn.Module")


def _check_callable(field: str, value: object, takes: str) -> None:
    if value is not None and not callable(value):
        raise config_error(
            field,
            value,
            f"None or a callable that takes {takes}",
            f"pass e.g. {field}=lambda x: ... rather than an instance.",
        )


def _check_loader(loader: object, field: str) -> None:
    if not isinstance(loader, Iterable):
        raise config_error(field, loader, "an iterable of batches, such as a torch DataLoader")
    if isinstance(loader, Sized) and len(loader) == 0:
        raise EmptyLoaderError(
            f"{field} has no batches (len 0); allowed: a loader with at least one batch. "
            "Fix: check the dataset, and drop_last with a batch size larger than the dataset."
        )


def _prefixed_errors(prefix: str, build: Callable[..., T]) -> Callable[..., T]:
    """Re-raise a component config's error under the factory's argument name (amp_dtype)."""

    def wrapper(**kwargs: Any) -> T:
        try:
            return build(**kwargs)
        except ConfigError as exc:
            raise ConfigError(f"{prefix}{exc}") from None

    return wrapper


def create_optimized_training_optimizer(
    *,
    model: nn.Module,
    train_loader: Iterable[Any],
    val_loader: Iterable[Any] | None = None,
    experiment_name: str = "experiment",
    max_epochs: int = 10,
    learning_rate: float = 1e-3,
    weight_decay: float = 0.01,
    early_stopping_patience: int | None = None,
    early_stopping_min_delta: float = 0.0,
    enable_amp: bool = True,
    amp_dtype: AmpDtype = "auto",
    enable_grad_scaler: bool = True,
    amp_init_scale: float = 2.0**16,
    amp_growth_factor: float = 2.0,
    amp_backoff_factor: float = 0.5,
    amp_growth_interval: int = 2000,
    amp_hysteresis: int = 0,
    amp_min_scale: float = 1.0,
    amp_max_scale: float = 2.0**24,
    gradient_accumulation_config: GradientAccumulationConfig | None = None,
    loss_fn: LossFn | None = None,
    optimizer: OptimizerFactory | None = None,
    scheduler: SchedulerFactory | None = None,
    max_grad_norm: float | None = None,
    log_dir: str | Path = "logs",
    seed: int | None = None,
    event_buffer_size: int = 1024,
    log_flush_interval_s: float = 0.25,
    multi_gpu_config: MultiGPUConfig | None = None,
    use_distributed_sampler: bool = True,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every_n_steps: int | None = None,
    checkpoint_every_n_epochs: int | None = 1,
    keep_last_n: int = 2,
    resume: str | Path | None = None,
    save_on_cancel: bool = True,
    handle_signals: bool = False,
    stop_grace_s: float = 30.0,
    data_stall_warn_s: float = 60.0,
    max_consecutive_nonfinite: int = 10,
    error_handler_config: ErrorHandlerConfig | None = None,
    monitor_interval_s: float = 1.0,
    tf32: bool = True,
    cudnn_benchmark: bool = False,
    memory_fraction: float | None = None,
) -> OptimizedTrainingOptimizer:
    """Validate every argument, then build the parts and the orchestrator.

    ``optimizer`` takes the model's parameters and returns a torch optimizer (default:
    AdamW with ``learning_rate`` and ``weight_decay``, fused where supported); ``scheduler``
    takes that optimizer and returns an LR scheduler stepped once per applied optimizer
    step. ``loss_fn`` defaults to ``CrossEntropyLoss()``; dict batches use the model's own
    loss instead. ``multi_gpu_config`` chooses where the job runs (default: auto, see
    ``core.multi_gpu_training``); under DDP/FSDP2 a plain DataLoader is rebuilt with a
    DistributedSampler unless ``use_distributed_sampler=False``. The checkpoint arguments
    form a :class:`~core.checkpointing.CheckpointConfig` (``resume="auto"`` continues from the
    newest valid checkpoint of the experiment). ``tf32``, ``cudnn_benchmark`` and
    ``memory_fraction`` are applied to CUDA devices by ``core.gpu_manager``; the monitor
    (``MultiGPUConfig.enable_gpu_monitoring``) samples every ``monitor_interval_s``.
    """
    _check_model(model)
    _check_loader(train_loader, "train_loader")
    if val_loader is not None:
        _check_loader(val_loader, "val_loader")
    _check_callable("loss_fn", loss_fn, "(outputs, targets) and returns a scalar tensor")
    _check_callable("optimizer", optimizer, "the model's parameters")
    _check_callable("scheduler", scheduler, "the optimizer")
    config = TrainingConfig(
        experiment_name=experiment_name,
        max_epochs=max_epochs,
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        early_stopping_patience=early_stopping_patience,
        early_stopping_min_delta=early_stopping_min_delta,
        max_grad_norm=max_grad_norm,
        log_dir=log_dir,
        seed=seed,
        event_buffer_size=event_buffer_size,
        log_flush_interval_s=log_flush_interval_s,
        handle_signals=handle_signals,
        stop_grace_s=stop_grace_s,
        data_stall_warn_s=data_stall_warn_s,
        monitor_interval_s=monitor_interval_s,
    )
    gpu_manager_config = GPUManagerConfig(
        tf32=tf32, cudnn_benchmark=cudnn_benchmark, memory_fraction=memory_fraction
    )
    checkpoint_config = CheckpointConfig(
        checkpoint_dir=checkpoint_dir,
        checkpoint_every_n_steps=checkpoint_every_n_steps,
        checkpoint_every_n_epochs=checkpoint_every_n_epochs,
        keep_last_n=keep_last_n,
        resume=resume,
        save_on_cancel=save_on_cancel,
    )
    errors_config = error_handler_config or ErrorHandlerConfig(
        max_consecutive_nonfinite=max_consecutive_nonfinite
    )
    precision_config = _prefixed_errors("amp_", MixedPrecisionConfig)(
        enable_amp=enable_amp,
        dtype=amp_dtype,
        enable_grad_scaler=enable_grad_scaler,
        init_scale=amp_init_scale,
        growth_factor=amp_growth_factor,
        backoff_factor=amp_backoff_factor,
        growth_interval=amp_growth_interval,
        hysteresis=amp_hysteresis,
        min_scale=amp_min_scale,
        max_scale=amp_max_scale,
    )
    if not any(p.requires_grad for p in model.parameters()):
        raise config_error("model", type(model).__name__, "a module with trainable parameters")
    trainer = MultiGPUTrainer(
        multi_gpu_config,
        use_distributed_sampler=use_distributed_sampler,
        seed=seed or 0,
        gpu_manager_config=gpu_manager_config,
    )
    trainer.setup()
    try:
        return _compose(
            trainer,
            model,
            train_loader,
            val_loader,
            config,
            precision_config,
            gradient_accumulation_config,
            loss_fn,
            optimizer,
            scheduler,
            checkpoint_config,
            errors_config,
        )
    except BaseException:
        trainer.cleanup()
        raise


def _compose(
    trainer: MultiGPUTrainer,
    model: nn.Module,
    train_loader: Iterable[Any],
    val_loader: Iterable[Any] | None,
    config: TrainingConfig,
    precision_config: MixedPrecisionConfig,
    accumulation_config: GradientAccumulationConfig | None,
    loss_fn: LossFn | None,
    optimizer: OptimizerFactory | None,
    scheduler: SchedulerFactory | None,
    checkpoint_config: CheckpointConfig,
    errors_config: ErrorHandlerConfig,
) -> OptimizedTrainingOptimizer:
    """Place the model, build optimizer and scheduler on the placed parameters, compose."""
    mixed_precision = MixedPrecisionTrainer(precision_config, trainer.device)
    wrapped = trainer.initialize_training(model, mixed_precision.amp_precision.dtype)
    params = [p for p in wrapped.parameters() if p.requires_grad]
    built_optimizer = (
        optimizer(params)
        if optimizer
        else default_optimizer(params, config.learning_rate, config.weight_decay)
    )
    if not isinstance(built_optimizer, torch.optim.Optimizer):
        raise config_error(
            "optimizer", built_optimizer, "a callable returning a torch.optim.Optimizer"
        )
    built_scheduler = scheduler(built_optimizer) if scheduler else None
    if built_scheduler is not None and not callable(getattr(built_scheduler, "step", None)):
        raise config_error("scheduler", built_scheduler, "a callable returning an LR scheduler")
    return OptimizedTrainingOptimizer(
        model=wrapped,
        train_loader=trainer.prepare_loader(train_loader, train=True),
        val_loader=None if val_loader is None else trainer.prepare_loader(val_loader, train=False),
        config=config,
        mixed_precision=mixed_precision,
        accumulation=GradientAccumulation(accumulation_config),
        multi_gpu_trainer=trainer,
        optimizer=built_optimizer,
        scheduler=built_scheduler,
        objective=Objective(loss_fn or nn.CrossEntropyLoss()),
        error_handler=ErrorHandler(errors_config),
        checkpoint_config=checkpoint_config,
    )

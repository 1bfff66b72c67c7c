"""``create_optimized_training_optimizer``: validate every argument, build the parts, compose.

The orchestrator itself lives in ``core.trainer.orchestrator``; both names are importable from here,
as in the seed API::

    from core.optimized_training_optimizer import create_optimized_training_optimizer

    optimizer = create_optimized_training_optimizer(
        model=model, train_loader=train_loader, val_loader=val_loader, max_epochs=3
    )
    results = await optimizer.train()
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from core.checkpointing.checkpointer import CheckpointConfig
from core.checks import check_writable_dir
from core.config import TrainingConfig
from core.errors import ConfigError, config_error
from core.hardware.settings import GPUManagerConfig
from core.loop.accumulation import GradientAccumulation, GradientAccumulationConfig
from core.loop.epoch import Scheduler
from core.loop.objective import DefaultObjective, LossFn, Objective
from core.loop.recovery import ErrorHandler, ErrorHandlerConfig
from core.loop.stepper import default_optimizer
from core.multi_gpu_training import MultiGPUConfig, MultiGPUTrainer
from core.precision.policy import AmpDtype, MixedPrecisionConfig, MixedPrecisionTrainer
from core.trainer.arguments import (
    built_by,
    check_callable,
    check_loader,
    check_loss_fn,
    check_model,
    check_optimizer,
    check_parts,
    check_scheduler,
)
from core.trainer.orchestrator import OptimizedTrainingOptimizer

__all__ = ("OptimizedTrainingOptimizer", "create_optimized_training_optimizer")

T = TypeVar("T")
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Scheduler]


def _renamed_errors(build: Callable[..., T], names: Mapping[str, str]) -> Callable[..., T]:
    """Re-raise a component config's error under the factory's argument names
    (``dtype`` becomes ``amp_dtype``), wherever the message names a field."""
    pattern = re.compile(r"\b(" + "|".join(names) + r")\b")

    def wrapper(**kwargs: Any) -> T:
        try:
            return build(**kwargs)
        except ConfigError as exc:
            raise ConfigError(pattern.sub(lambda m: names[m[1]], str(exc))) from None

    return wrapper


_AMP_ARGUMENTS = {
    name: f"amp_{name}"
    for name in (
        "dtype", "init_scale", "growth_factor", "backoff_factor", "growth_interval",
        "hysteresis", "min_scale", "max_scale",
    )
}  # fmt: skip


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
    max_consecutive_nonfinite: int | None = None,
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
    ``memory_fraction`` are applied to CUDA devices by ``core.hardware.settings``; the monitor
    (``MultiGPUConfig.enable_gpu_monitoring``) samples every ``monitor_interval_s``.

    A bad argument raises :class:`~core.errors.ConfigError` here, naming it: wrong types
    (``True`` is not a number, ``'no'`` not a flag), a ``log_dir`` that cannot be created or
    written (it is created and probed), a factory that raises, an optimizer over parameters
    that are not the model's, ``ReduceLROnPlateau`` (it needs a metric; not supported yet),
    and a one-shot iterator as a loader when ``max_epochs > 1``. Loaders without ``len()``
    (a DataLoader over an ``IterableDataset``) are streamed.
    """
    check_model(model)
    check_loss_fn(loss_fn)
    check_callable("optimizer", optimizer, "the model's parameters")
    check_callable("scheduler", scheduler, "the optimizer")
    check_parts(
        gradient_accumulation_config,
        multi_gpu_config,
        error_handler_config,
        checkpoint_dir,
        use_distributed_sampler,
    )
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
    check_loader(train_loader, "train_loader", max_epochs)
    if val_loader is not None:
        check_loader(val_loader, "val_loader", max_epochs)
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
    if error_handler_config is not None and max_consecutive_nonfinite is not None:
        raise config_error(
            "max_consecutive_nonfinite", max_consecutive_nonfinite,
            "None when error_handler_config is given (one place for each setting)",
            "set it inside error_handler_config=ErrorHandlerConfig(max_consecutive_nonfinite=...).",
        )  # fmt: skip
    errors_config = error_handler_config or ErrorHandlerConfig(
        max_consecutive_nonfinite=10
        if max_consecutive_nonfinite is None
        else max_consecutive_nonfinite
    )
    precision_config = _renamed_errors(MixedPrecisionConfig, _AMP_ARGUMENTS)(
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
    check_writable_dir("log_dir", log_dir)
    if checkpoint_dir is not None:
        check_writable_dir("checkpoint_dir", checkpoint_dir)
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
        built_by("optimizer", optimizer, params)
        if optimizer
        else default_optimizer(params, config.learning_rate, config.weight_decay)
    )
    check_optimizer(built_optimizer, wrapped)
    built_scheduler = built_by("scheduler", scheduler, built_optimizer) if scheduler else None
    check_scheduler(built_scheduler)
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
        objective=DefaultObjective() if loss_fn is None else Objective(loss_fn),
        error_handler=ErrorHandler(errors_config),
        checkpoint_config=checkpoint_config,
    )

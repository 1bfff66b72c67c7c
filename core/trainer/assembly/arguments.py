"""Checks of the runtime objects a training job is given.

Settings are checked by their config dataclasses; each failure here is a
:class:`~core.errors.ConfigError` naming the argument, the bad value, what is allowed and a fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any, TypeVar

import torch
from torch import nn

from core.checks import check_bool, check_writable_dir, is_path
from core.distributed.config import MultiGPUConfig
from core.errors import EmptyLoaderError, config_error
from core.loop.accumulation import GradientAccumulationConfig
from core.loop.recovery import ErrorHandlerConfig
from core.metrics import check_metrics
from core.stopping.early_stopping import watched

__all__ = (
    "built_by",
    "check_directories",
    "check_loader",
    "check_optimizer",
    "check_parts",
    "check_runtime",
    "check_scheduler",
    "is_scheduler_instance",
)

T = TypeVar("T")

_FACTORY_CONTRACTS = {
    "optimizer": "a callable that takes a list of the model's parameters and returns a "
    "torch.optim.Optimizer",
    "scheduler": "a callable that takes the optimizer and returns an LR scheduler",
}
_FACTORY_EXAMPLES = {
    "loss_fn": "a loss module such as loss_fn=nn.CrossEntropyLoss() or nn.MSELoss()",
    "training_step": "a function such as def training_step(model, batch): return loss",
    "validation_step": "a function such as def validation_step(model, batch): return loss",
    "optimizer": "an optimizer over the model's parameters, e.g. "
    "optimizer=torch.optim.SGD(model.parameters(), lr=0.1), or a factory, e.g. "
    "optimizer=lambda params: torch.optim.SGD(params, lr=0.1)",
    "scheduler": "a scheduler of that optimizer, e.g. "
    "torch.optim.lr_scheduler.StepLR(optimizer, step_size=100), or a factory, e.g. "
    "scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=100)",
}


def is_scheduler_instance(value: object) -> bool:
    return callable(getattr(value, "step", None)) and hasattr(value, "optimizer")


def _check_callable(field: str, value: object, takes: str) -> None:
    if value is not None and not callable(value):
        raise config_error(
            field,
            value,
            f"None or a callable that takes {takes}",
            f"pass {_FACTORY_EXAMPLES[field]}.",
        )


def _check_loss_fn(loss_fn: object) -> None:
    _check_callable("loss_fn", loss_fn, "(outputs, targets) and returns a scalar tensor")
    if isinstance(loss_fn, type) and issubclass(loss_fn, nn.Module):
        name = f"nn.{loss_fn.__name__}" if hasattr(nn, loss_fn.__name__) else loss_fn.__name__
        raise config_error(
            "loss_fn",
            loss_fn,
            "None or an instance of a loss module",
            f"pass an instance, {name}(), not the class {name}.",
        )


def _check_step_functions(runtime: Any) -> None:
    """``training_step``/``validation_step``: callables of ``(model, batch)``, the first
    without a ``loss_fn`` (it computes the loss itself)."""
    for name in ("training_step", "validation_step"):
        _check_callable(name, getattr(runtime, name), "(model, batch) and returns the loss")
    if runtime.training_step is not None and runtime.loss_fn is not None:
        raise config_error(
            "loss_fn",
            runtime.loss_fn,
            "None when training_step is given",
            "training_step(model, batch) returns the loss itself: compute it there, e.g. "
            "return loss_fn(model(inputs), targets), and drop loss_fn=.",
        )


def check_parts(settings: Mapping[str, Any]) -> None:
    """The section objects among the factory's keywords, and the checkpoint directory."""
    gradient_accumulation_config = settings.get("gradient_accumulation_config")
    multi_gpu_config = settings.get("multi_gpu_config")
    error_handler_config = settings.get("error_handler_config")
    checkpoint_dir = settings.get("checkpoint_dir")
    steps = gradient_accumulation_config if isinstance(gradient_accumulation_config, int) else 4
    mode = multi_gpu_config if isinstance(multi_gpu_config, str) else "cpu"
    for field, value, kind, fix in (
        (
            "gradient_accumulation_config",
            gradient_accumulation_config,
            GradientAccumulationConfig,
            f"GradientAccumulationConfig(accumulation_steps={steps!r})",
        ),
        (
            "multi_gpu_config",
            multi_gpu_config,
            MultiGPUConfig,
            f"MultiGPUConfig(training_mode={mode!r})",
        ),
        (
            "error_handler_config",
            error_handler_config,
            ErrorHandlerConfig,
            "ErrorHandlerConfig(**the_dict)"
            if isinstance(error_handler_config, Mapping)
            else "ErrorHandlerConfig(max_consecutive_nonfinite=10)",
        ),
    ):
        if value is not None and not isinstance(value, kind):
            raise config_error(
                field, value, f"None or an instance of {kind.__name__}", f"pass {fix}."
            )
    if checkpoint_dir is not None and not is_path(checkpoint_dir):
        raise config_error(
            "checkpoint_dir",
            checkpoint_dir,
            "None (under log_dir) or a non-empty str or pathlib.Path",
            "e.g. checkpoint_dir='checkpoints'.",
        )
    if "use_distributed_sampler" in settings:
        check_bool("use_distributed_sampler", settings["use_distributed_sampler"])


def check_loader(loader: object, field: str, max_epochs: int) -> None:
    if not isinstance(loader, Iterable):
        raise config_error(field, loader, "an iterable of batches, such as a torch DataLoader")
    if isinstance(loader, Iterator) and max_epochs > 1:
        raise config_error(
            field,
            loader,
            "a re-iterable of batches (a DataLoader or a list) when max_epochs > 1",
            "this is a one-shot iterator (a generator?) that would be empty from the second "
            "epoch on; pass a DataLoader or list(batches), or max_epochs=1.",
        )
    try:
        size = len(loader) if isinstance(loader, Sized) else None
    except TypeError:  # a DataLoader over an IterableDataset without __len__: streamed
        size = None
    if size == 0:
        raise EmptyLoaderError(
            f"{field} has no batches (len 0); allowed: a loader with at least one batch. "
            "Fix: check the dataset, and drop_last with a batch size larger than the dataset."
        )


def built_by(field: str, factory: Callable[[Any], T], argument: object) -> T:
    """Call a user's factory; its exception becomes a ConfigError naming the argument."""
    try:
        return factory(argument)
    except Exception as exc:
        raise config_error(
            field,
            factory,
            _FACTORY_CONTRACTS[field],
            f"calling it raised {type(exc).__name__}: {exc} (chained below); pass "
            f"{_FACTORY_EXAMPLES[field]}.",
        ) from exc


def check_optimizer(optimizer: object, model: nn.Module, *, given: bool = False) -> None:
    """An optimizer over parameters of ``model`` (as placed and wrapped); ``given``: the
    user passed this instance (rather than a factory)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise config_error("optimizer", optimizer, "a callable returning a torch.optim.Optimizer")
    held = [p for group in optimizer.param_groups for p in group["params"]]
    own = {id(p) for p in model.parameters()}
    foreign = sum(id(p) not in own for p in held)
    if not held or foreign:
        problem = (
            "it holds no parameters"
            if not held
            else f"{foreign} of its {len(held)} parameters are not the model's (as placed and "
            "wrapped by core)"
        )
        if given:
            raise config_error(
                "optimizer",
                optimizer,
                "an optimizer over the model's parameters, or a factory",
                f"{problem}; build it on this model's parameters, or (FSDP2 replaces them with "
                "sharded ones) pass a factory: optimizer=lambda params: "
                "torch.optim.AdamW(params, lr=1e-3).",
            )
        raise config_error(
            "optimizer",
            optimizer,
            "a factory whose optimizer holds the parameters it is given",
            f"{problem}; build it from the argument: "
            "optimizer=lambda params: torch.optim.SGD(params, lr=0.1).",
        )


def check_scheduler(scheduler: object, optimizer: torch.optim.Optimizer) -> None:
    if scheduler is None:
        return
    bound = getattr(scheduler, "optimizer", optimizer)
    if bound is not optimizer:
        raise config_error(
            "scheduler",
            scheduler,
            "a scheduler of the run's optimizer",
            "it drives another optimizer; build it on the optimizer you pass, or pass a "
            "factory: scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 100).",
        )
    if not callable(getattr(scheduler, "step", None)):
        raise config_error("scheduler", scheduler, "a callable returning an LR scheduler")


def _check_monitor(
    config: Any, has_validation: bool, metrics: Mapping[str, Any], step_logs: bool = False
) -> None:
    """``monitor`` and ``early_stopping.monitor``, where used, must name a value the run will
    produce (``step_logs``: a step function's logged values may be any ``val_<name>``)."""
    names = ["train_loss"]
    validates = has_validation and (config.run.val_every_n_epochs or config.run.val_every_n_steps)
    if validates:
        names += ["val_loss", "val_accuracy", *(f"val_{name}" for name in metrics)]
    why = "" if has_validation else " (without a val_loader only the training loss exists)"
    wanted = []
    if config.checkpoint.tracks_best:
        wanted.append(("monitor", config.checkpoint.monitor))
    if config.early_stopping.enabled:
        wanted.append(("early_stopping.monitor", watched(config, has_validation)[0]))
    for field, name in wanted:
        if name not in names and not (validates and step_logs and name.startswith("val_")):
            raise config_error(
                field,
                name,
                f"one of {', '.join(map(repr, names))}{why}",
                "name a metric given in metrics= as 'val_<name>', pass a val_loader, or "
                "monitor='train_loss'.",
            )


def check_runtime(runtime: Any, config: Any, callbacks: object) -> None:
    """Every runtime object of a run (a ``Runtime``), before building: cheap checks only."""
    from core.callbacks import Callback
    from core.config import TrainingConfig

    if not isinstance(config, TrainingConfig):
        raise config_error(
            "config",
            config,
            "None or a TrainingConfig",
            "build one: TrainingConfig(run=RunConfig(max_epochs=3)), or give flat keywords "
            "(max_epochs=3) to the factory function exported beside this class.",
        )
    if not isinstance(runtime.model, nn.Module):
        raise config_error("model", runtime.model, "a torch.nn.Module")
    _check_loss_fn(runtime.loss_fn)
    _check_step_functions(runtime)
    if not isinstance(runtime.optimizer, torch.optim.Optimizer):
        _check_callable("optimizer", runtime.optimizer, "the model's parameters")
    if not is_scheduler_instance(runtime.scheduler):
        _check_callable("scheduler", runtime.scheduler, "the optimizer")
    max_epochs = config.run.max_epochs
    check_loader(runtime.train_loader, "train_loader", max_epochs)
    if runtime.val_loader is not None:
        check_loader(runtime.val_loader, "val_loader", max_epochs)
    if isinstance(runtime.optimizer, torch.optim.Optimizer):
        check_optimizer(runtime.optimizer, runtime.model, given=True)
    if not any(p.requires_grad for p in runtime.model.parameters()):
        raise config_error(
            "model", type(runtime.model).__name__, "a module with trainable parameters"
        )
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
        raise config_error("callbacks", callbacks, "a list of core.callbacks.Callback")
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise config_error(
                "callbacks",
                callback,
                "instances of core.callbacks.Callback",
                "subclass Callback and override the hooks you need.",
            )
    if runtime.metrics is not None:
        check_metrics(runtime.metrics)
    step_logs = runtime.training_step is not None or runtime.validation_step is not None
    _check_monitor(config, runtime.val_loader is not None, runtime.metrics or {}, step_logs)


def check_directories(config: Any) -> None:
    """The directories a run writes, each created if missing and probed with a file (a worker
    thread's call, where the run starts)."""
    if config.run.keeps_files:  # a smoke run writes nothing there
        check_writable_dir("log_dir", config.run.log_dir)
    if config.checkpoint.checkpoint_dir is not None:
        check_writable_dir("checkpoint_dir", config.checkpoint.checkpoint_dir)

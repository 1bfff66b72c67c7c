"""The learning-rate range test (Leslie Smith, "Cyclical Learning Rates for Training Neural
Networks", 2017; what Lightning's ``Tuner.lr_find`` and fastai's ``lr_find`` run).

A short training run raises the learning rate exponentially, one step per batch, from
``min_lr`` to ``max_lr``, and records the loss of every batch; the rate to train with lies
on the steep fall, well before the bottom (:mod:`core.tuning.suggest`). The model's weights,
buffers, gradients, modes, device and every RNG are put back as they were.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

import structlog
import torch
from torch import nn

from core.config import OptimConfig
from core.errors import ConfigError, EmptyLoaderError, config_error
from core.loop.objective import DefaultObjective, LossFn, Objective
from core.loop.step import default_optimizer
from core.memory.trial import preserved
from core.precision.config import AmpDtype, MixedPrecisionConfig, parse_amp_dtype
from core.precision.policy import resolve_precision
from core.tuning.config import MIN_STEPS, LRFinderConfig
from core.tuning.result import LRFinderResult
from core.tuning.suggest import RAN_OUT, suggest_learning_rate, too_short
from core.tuning.sweep_step import SweepStep

__all__ = ("OptimizerArgument", "find_learning_rate")

OptimizerArgument = torch.optim.Optimizer | Callable[[list[nn.Parameter]], torch.optim.Optimizer]
"""An optimizer instance (a fresh one of its class and settings is trained), or a factory
taking the parameters (a class such as ``torch.optim.SGD`` with a default ``lr`` is one)."""

_log = structlog.get_logger("core")
_END = object()


def find_learning_rate(
    model: nn.Module,
    train_loader: Iterable[Any],
    *,
    loss_fn: LossFn | None = None,
    optimizer: OptimizerArgument | None = None,
    min_lr: float = 1e-7,
    max_lr: float = 1.0,
    num_steps: int = 100,
    smoothing: float = 0.98,
    diverge_factor: float | None = 4.0,
    max_grad_norm: float | None = None,
    device: torch.device | str | None = None,
    precision: AmpDtype = "auto",
) -> LRFinderResult:
    """Run a learning-rate range test and suggest a learning rate (docs/training.md).

    ``loss_fn`` and ``optimizer`` are what the run would take (an optimizer instance is not
    stepped: a fresh one of its class and settings is); ``precision`` is the run's
    ``amp_dtype``; the other settings are :class:`~core.tuning.config.LRFinderConfig`'s.
    Bad input raises :class:`~core.errors.ConfigError` naming the argument, before any step.

    Example::

        result = find_learning_rate(model, train_loader, num_steps=100)
        optim = OptimConfig(learning_rate=result.suggestion)  # the run's optimizer section
    """
    config = LRFinderConfig(
        min_lr=min_lr,
        max_lr=max_lr,
        num_steps=num_steps,
        smoothing=smoothing,
        diverge_factor=diverge_factor,
        max_grad_norm=max_grad_norm,
    )
    if not isinstance(model, nn.Module):
        raise config_error("model", model, "a torch.nn.Module")
    _check_loader(train_loader)
    if loss_fn is not None and not callable(loss_fn):
        raise config_error("loss_fn", loss_fn, "None or a callable (outputs, targets) -> loss")
    place = _place(model, device)
    parse_amp_dtype(precision, "precision")  # a bad value names this argument
    amp = resolve_precision(MixedPrecisionConfig(dtype=precision), place)
    objective = DefaultObjective() if loss_fn is None else Objective(loss_fn)
    original = _device_of(model)
    modes = [(module, module.training) for module in model.modules()]
    _log.info(
        "lr_find_start",
        min_lr=config.min_lr,
        max_lr=config.max_lr,
        num_steps=config.num_steps,
        device=str(place),
        precision=amp.name,
    )
    with preserved(model):
        trained: torch.optim.Optimizer | None = None
        try:
            model.to(place).train()
            params = [p for p in model.parameters() if p.requires_grad]
            trained = _build_optimizer(optimizer, params, config.min_lr)
            lrs, losses, smoothed, stopped = _sweep(
                SweepStep(model, trained, objective, amp, config, place, params),
                train_loader,
                config,
            )
        finally:
            if trained is not None:
                trained.state.clear()
            model.to(original)
            for module, training in modes:
                module.training = training
    if len(lrs) < MIN_STEPS:  # too few points to read a curve from
        suggestion, reason = None, too_short(len(lrs), stopped, config.num_steps)
        lowest = lrs[smoothed.index(min(smoothed))] if lrs else config.min_lr
    else:
        suggestion, reason, lowest = suggest_learning_rate(lrs, smoothed, config.min_lr)
    result = LRFinderResult(
        lrs=tuple(lrs),
        losses=tuple(losses),
        smoothed_losses=tuple(smoothed),
        suggestion=suggestion,
        reason=reason,
        stopped=stopped,
        min_loss_lr=lowest,
        config=config,
        device=str(place),
        precision=amp.name,
    )
    _log.info(
        "lr_find_done",
        suggestion=suggestion,
        reason=reason,
        stopped=stopped,
        steps=result.steps,
        min_loss_lr=lowest,
    )
    return result


def _sweep(
    steps: SweepStep, loader: Iterable[Any], config: LRFinderConfig
) -> tuple[list[float], list[float], list[float], str]:
    """Train ``config.num_steps`` steps at rising rates; the curve and why it ended."""
    lrs: list[float] = []
    losses: list[float] = []
    smoothed: list[float] = []
    average, lowest = 0.0, math.inf
    beta, factor = config.smoothing, config.diverge_factor
    batches = _cycle(loader)
    stopped = f"ran all {config.num_steps} steps"
    for step in range(config.num_steps):
        batch = next(batches, _END)
        if batch is _END:
            stopped = f"{RAN_OUT} after {step} batches (an iterator is not cycled)"
            break
        lr = config.learning_rate(step)
        loss = steps(batch, lr, step)
        value = float(loss)  # host sync: each step's loss decides whether the sweep goes on
        lrs.append(lr)
        losses.append(value)
        if not math.isfinite(value):
            smoothed.append(math.inf)
            stopped = f"diverged: the loss was {value} at lr {lr:.2e} (step {step})"
            break
        average = beta * average + (1.0 - beta) * value
        smooth = average / (1.0 - beta ** (step + 1))  # bias-corrected, as Adam's moments
        smoothed.append(smooth)
        lowest = min(lowest, smooth)
        if factor is not None and lowest > 0 and smooth > factor * lowest:
            stopped = (
                f"diverged at lr {lr:.2e} (step {step}): the smoothed loss {smooth:.4g} "
                f"passed {factor:g}x its lowest, {lowest:.4g}"
            )
            break
    return lrs, losses, smoothed, stopped


def _cycle(loader: Iterable[Any]) -> Iterator[Any]:
    """The loader's batches, from the start again each time it runs out (a new epoch)."""
    drawn = 0
    while True:
        before = drawn
        for batch in loader:
            drawn += 1
            yield batch
        if drawn == 0:
            raise _empty(loader)
        if drawn == before:  # a one-shot iterator, spent
            return


def _check_loader(loader: object) -> None:
    if not isinstance(loader, Iterable):
        raise config_error(
            "train_loader", loader, "an iterable of batches, such as a torch DataLoader"
        )
    with contextlib.suppress(TypeError):  # no len(): a stream, checked at its first batch
        if isinstance(loader, Sized) and len(loader) == 0:
            raise _empty(loader)


def _empty(loader: object) -> ConfigError:
    return config_error(
        "train_loader",
        loader,
        "a loader with at least one batch",
        "check the dataset's length and the batch size (drop_last=True drops a short batch).",
        error=EmptyLoaderError,
    )


def _build_optimizer(
    argument: OptimizerArgument | None, params: list[nn.Parameter], lr: float
) -> torch.optim.Optimizer:
    """The optimizer the sweep steps: the run's default AdamW, a fresh copy of an instance's
    class and settings (the caller's own is never stepped), or the factory's."""
    if argument is None:
        return default_optimizer(params, lr, OptimConfig().weight_decay)
    if isinstance(argument, torch.optim.Optimizer):
        kind = type(argument)
        accepted = inspect.signature(kind.__init__).parameters  # AdamW records more defaults
        return kind(params, **{k: v for k, v in argument.defaults.items() if k in accepted})
    allowed = "None, a torch.optim.Optimizer or a callable taking the model's parameters"
    fix = "e.g. optimizer=torch.optim.AdamW or optimizer=lambda p: torch.optim.SGD(p, lr=0.1)."
    if not callable(argument):
        raise config_error("optimizer", argument, allowed, fix)
    try:
        built = argument(params)
    except Exception as exc:
        raise config_error(
            "optimizer",
            argument,
            allowed,
            f"calling it with the parameters raised {type(exc).__name__}: {exc}; {fix}",
        ) from exc
    if not isinstance(built, torch.optim.Optimizer):
        raise config_error("optimizer", argument, allowed, f"it returned {built!r}; {fix}")
    ours = {id(p) for p in params}
    if any(id(p) not in ours for group in built.param_groups for p in group["params"]):
        raise config_error(
            "optimizer",
            argument,
            "a factory over the parameters it is given",
            "build the optimizer from the factory's argument, not from other parameters.",
        )
    return built


def _place(model: nn.Module, device: torch.device | str | None) -> torch.device:
    """``device``, or core's choice: the model's accelerator, else cuda:0, else the CPU."""
    if device is None:
        current = _device_of(model)
        cuda = current.type == "cpu" and torch.cuda.is_available()
        return torch.device("cuda", 0) if cuda else current
    allowed = "None, a torch.device or a name such as 'cpu' or 'cuda:0'"
    try:
        place = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise config_error("device", device, allowed) from None
    if place.type == "cuda" and not torch.cuda.is_available():
        raise config_error("device", device, allowed, "this machine has no CUDA device.")
    return place


def _device_of(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")

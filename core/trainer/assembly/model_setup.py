"""The model before it is wrapped: transforms in their fixed order, and the batch-size search.

    activation checkpointing -> channels_last -> [batch-size search] -> compile -> (wrap)

A loader batch larger than the size found is split into micro-batches of that size: the
effective batch (and the result) is unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import nn

from core.config import TrainingConfig
from core.data.batches import count_samples, to_device
from core.distributed.base import Strategy
from core.loop.objective import Objective
from core.memory.batches import batch_maker_from
from core.memory.finder import BatchSizeSearch, find_batch_size
from core.memory.trial import OptimizerFactory
from core.precision.policy import PrecisionPolicy
from core.rng import capture_rng, restore_rng
from core.transforms.apply import TransformReport, apply_model_transforms
from core.transforms.channels_last import channels_last_batch
from core.transforms.compile import compile_model
from core.transforms.payback import CompileWhenItPays, payback_rule, planned_steps

__all__ = (
    "PreparedModel",
    "compile_rule_for",
    "first_batch",
    "optimizer_factory_like",
    "prepare_model",
)

Emit = Callable[..., None]


@dataclass(frozen=True)
class PreparedModel:
    """What :func:`prepare_model` did, and how batches reach the model."""

    transforms: TransformReport
    search: BatchSizeSearch | None
    micro_batch_size: int | None
    """The accumulation's micro-batch size after the search (the configured one without)."""
    prepare_batch: Callable[[Any], Any]

    def describe(self) -> dict[str, Any]:
        """For ``run_start``'s ``resolved`` part."""
        return {
            **self.transforms.to_dict(),
            "batch_size_search": None if self.search is None else self.search.to_dict(),
            "micro_batch_size": self.micro_batch_size,
        }


def prepare_model(
    model: nn.Module,
    config: TrainingConfig,
    *,
    strategy: Strategy,
    precision: PrecisionPolicy,
    objective: Objective,
    train_loader: Iterable[Any],
    optimizer_factory: OptimizerFactory | None,
    emit: Emit,
    report_error: Emit,
) -> PreparedModel:
    """Transform ``model`` in place (and search its batch size when asked)."""
    device = strategy.device
    found: list[tuple[BatchSizeSearch, int]] = []  # the search, the loader's batch size

    # Before compilation: a compiled model would recompile at every trial's batch shape, and
    # eager memory is the conservative measure.
    def search(transformed: nn.Module) -> None:
        if config.memory.auto_batch_size:
            args = (config, device, precision, objective, train_loader, optimizer_factory)
            found.append(_search(transformed, *args))

    report = apply_model_transforms(
        model,
        config.transforms,
        device,
        emit=emit,
        report_error=report_error,
        compile_blocks=config.distributed.training_mode == "fsdp",
        before_compile=search,
    )
    micro = config.accumulation.micro_batch_size
    result = found[0][0] if found else None
    if found and result is not None and result.batch_size < found[0][1]:
        micro = min(micro or result.batch_size, result.batch_size)
    move = partial(to_device, device=device)
    prepare = _channels_last(move) if report.channels_last else move
    return PreparedModel(report, result, micro, prepare)


def _channels_last(move: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def prepare(batch: Any) -> Any:
        return channels_last_batch(move(batch))

    return prepare


def _search(
    model: nn.Module,
    config: TrainingConfig,
    device: torch.device,
    precision: PrecisionPolicy,
    objective: Objective,
    train_loader: Iterable[Any],
    optimizer_factory: OptimizerFactory | None,
) -> tuple[BatchSizeSearch, int]:
    first = first_batch(train_loader)
    model.to(device)  # the strategy's wrap moves it anyway; the trials need it there
    memory = config.memory
    search = find_batch_size(
        model,
        None,
        memory.target_memory_gb,
        memory.max_batch_size,
        memory.margin,
        loss_fn=objective.loss,
        optimizer_factory=optimizer_factory,
        autocast=precision.precision.autocast,
        device=device,
        make_batch=batch_maker_from(first),
    )
    return search, count_samples(first)


def first_batch(loader: Iterable[Any]) -> Any:
    """``loader``'s first batch, drawn with every RNG restored after (a shuffling loader draws
    its order: the run must not notice)."""
    state = capture_rng()
    try:
        return next(iter(loader))
    finally:
        restore_rng(state)


def optimizer_factory_like(optimizer: object) -> OptimizerFactory | None:
    """A factory of fresh optimizers of ``optimizer``'s class and settings (for the trials);
    None (the default AdamW) when there is no instance."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    kind = type(optimizer)
    # Only what the constructor takes: torch's AdamW records ``decoupled_weight_decay`` in
    # its defaults but does not accept it.
    accepted = inspect.signature(kind.__init__).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}

    def build(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return kind(params, **defaults)

    return build


def compile_rule_for(
    config: TrainingConfig,
    prepared: PreparedModel,
    model: nn.Module,
    batches_per_epoch: int | None,
    emit: Emit,
    report_error: Emit,
) -> tuple[CompileWhenItPays | None, PreparedModel]:
    """``compile="auto"`` on CUDA: the step hook that decides after timing eager steps; None
    elsewhere."""
    transforms = prepared.transforms
    if not transforms.compile_deferred:
        return None, prepared
    run = config.run
    planned = planned_steps(
        batches_per_epoch, config.accumulation.accumulation_steps, run.max_epochs, run.max_steps
    )
    if planned is None:
        reason = "auto: off, the run's length is unknown (a stream without max_steps)"
        return None, replace(prepared, transforms=replace(transforms, compile=reason))
    settings = config.transforms

    def compile_now() -> list[str]:
        return compile_model(
            model,
            mode=settings.compile_mode,
            fullgraph=settings.compile_fullgraph,
            emit=emit,
            report_error=report_error,
        )

    rule = CompileWhenItPays(planned_steps=planned, compile_now=compile_now, emit=emit)
    reason = (
        f"auto: decided after {rule.warmup_steps + rule.measure_steps} eager steps of "
        f"{planned} planned; {payback_rule()}"
    )
    return rule, replace(prepared, transforms=replace(transforms, compile=reason))

"""Making a model's training step use less memory, and ``GPUMemoryOptimizer``, one object
over the memory tools (model transforms, batch-size search, memory profile).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import nn

from core.errors import config_error
from core.memory.batches import BatchMaker, batch_maker_for_shape, check_input_shape
from core.memory.config import MemoryConfig
from core.memory.finder import BatchSizeSearch, find_batch_size
from core.memory.meter import meter_for
from core.memory.profile import MemoryProfile, profile_memory_usage
from core.memory.trial import (
    Autocast,
    LossFn,
    OptimizerFactory,
    device_for,
    preserved,
    run_trial,
)
from core.transforms.activation_checkpointing import apply_activation_checkpointing, find_blocks
from core.transforms.channels_last import (
    apply_channels_last,
    channels_last_batch,
    wants_channels_last,
)

__all__ = ("GPUMemoryOptimizer", "MemoryOptimization", "optimize_model_memory")


@dataclass(frozen=True)
class MemoryOptimization:
    """What :func:`optimize_model_memory` changed, and a step's peak before and after
    (``None``: out of memory)."""

    activation_checkpointed: tuple[str, ...]
    channels_last: bool
    peak_before_bytes: int | None
    peak_after_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "activation_checkpointed": list(self.activation_checkpointed),
            "channels_last": self.channels_last,
            "peak_before_bytes": self.peak_before_bytes,
            "peak_after_bytes": self.peak_after_bytes,
        }


def _block_types(value: object) -> tuple[str, ...] | None:
    """``None`` for the default block policy, a tuple of class names, or ``()`` for off."""
    if value is True:
        return None
    if value is False:
        return ()
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise config_error(
        "activation_checkpointing",
        value,
        "True (repeated blocks), False, or a non-empty tuple of block class names",
        'pass e.g. activation_checkpointing=("TransformerBlock",).',
    )


def optimize_model_memory(
    model: nn.Module,
    input_shape: Sequence[int] | None,
    *,
    activation_checkpointing: bool | Sequence[str] = True,
    channels_last: Literal["auto"] | bool = "auto",
    device: torch.device | str | None = None,
    loss_fn: LossFn | None = None,
    optimizer_factory: OptimizerFactory | None = None,
    autocast: Autocast | None = None,
    make_batch: BatchMaker | None = None,
) -> MemoryOptimization:
    """Apply activation checkpointing (to repeated blocks, or the named block classes) and
    channels_last (``"auto"``: convolutional models on CUDA) in place, measuring a training
    step at ``input_shape[0]`` samples before and after; weights, gradients and RNG are kept.

    >>> optimize_model_memory(model, (64, 128, 512)).peak_after_bytes  # doctest: +SKIP
    """
    blocks = _block_types(activation_checkpointing)
    if channels_last not in ("auto", True, False):
        raise config_error("channels_last", channels_last, ("auto", True, False))
    given = input_shape is not None or make_batch is None
    shape = check_input_shape(input_shape) if given else None
    place = device_for(model, device)
    maker = make_batch or batch_maker_for_shape(shape or (1,), device=place)
    meter = meter_for(place)

    def peak(make: BatchMaker) -> int | None:
        with preserved(model):
            trial = run_trial(
                model,
                make,
                shape[0] if shape else 1,
                loss_fn=loss_fn,
                optimizer_factory=optimizer_factory,
                autocast=autocast,
                meter=meter,
            )
        return trial.peak_bytes

    before = peak(maker)
    checkpointed: list[str] = []
    if blocks is None and find_blocks(model):
        checkpointed = apply_activation_checkpointing(model)
    elif blocks:
        checkpointed = apply_activation_checkpointing(model, blocks)
    use_channels_last = wants_channels_last(channels_last, model, place)
    after_maker = maker
    if use_channels_last:
        apply_channels_last(model)

        def after_maker(n: int) -> Any:
            return channels_last_batch(maker(n))

    return MemoryOptimization(
        activation_checkpointed=tuple(checkpointed),
        channels_last=use_channels_last,
        peak_before_bytes=before,
        peak_after_bytes=peak(after_maker),
    )


class GPUMemoryOptimizer:
    """The memory tools in one object: transforms, batch-size search and profile for one device
    (default: the model's), under a :class:`MemoryConfig`; the last reports are kept.

    >>> memory = GPUMemoryOptimizer(MemoryConfig(target_memory_gb=8.0))
    >>> memory.optimize_batch_size(model, (32, 784))  # doctest: +SKIP
    """

    def __init__(
        self,
        config: MemoryConfig | None = None,
        *,
        device: torch.device | str | None = None,
        loss_fn: LossFn | None = None,
        optimizer_factory: OptimizerFactory | None = None,
        autocast: Autocast | None = None,
    ) -> None:
        if config is not None and not isinstance(config, MemoryConfig):
            raise config_error("config", config, "a MemoryConfig or None", "e.g. MemoryConfig().")
        self.config = config or MemoryConfig()
        self.device = torch.device(device) if device is not None else None
        self.loss_fn = loss_fn
        self.optimizer_factory = optimizer_factory
        self.autocast = autocast
        self.last_optimization: MemoryOptimization | None = None
        self.last_search: BatchSizeSearch | None = None

    def optimize_model_memory(self, model: nn.Module, input_shape: Sequence[int]) -> nn.Module:
        """:func:`optimize_model_memory` in place; the report goes to ``last_optimization``."""
        self.last_optimization = optimize_model_memory(
            model,
            input_shape,
            device=self.device,
            loss_fn=self.loss_fn,
            optimizer_factory=self.optimizer_factory,
            autocast=self.autocast,
        )
        return model

    def optimize_batch_size(
        self,
        model: nn.Module,
        input_shape: Sequence[int],
        target_memory_gb: float | None = None,
        max_batch_size: int | None = None,
        margin: float | None = None,
    ) -> int:
        """:func:`find_batch_size`'s answer, ``None`` arguments from the config; the search
        goes to ``last_search``."""
        base = self.config
        target = base.target_memory_gb if target_memory_gb is None else target_memory_gb
        config = replace(  # validated again, as MemoryConfig's own fields
            base,
            target_memory_gb=target,
            max_batch_size=base.max_batch_size if max_batch_size is None else max_batch_size,
            margin=base.margin if margin is None else margin,
        )
        self.last_search = find_batch_size(
            model,
            input_shape,
            config.target_memory_gb,
            config.max_batch_size,
            config.margin,
            loss_fn=self.loss_fn,
            optimizer_factory=self.optimizer_factory,
            autocast=self.autocast,
            device=self.device,
        )
        return self.last_search.batch_size

    def profile_memory_usage(
        self, model: nn.Module, input_shape: Sequence[int], batch_sizes: Sequence[int] | None = None
    ) -> dict[int, MemoryProfile]:
        """:func:`profile_memory_usage` on this optimizer's device."""
        return profile_memory_usage(
            model,
            input_shape,
            batch_sizes,
            loss_fn=self.loss_fn,
            optimizer_factory=self.optimizer_factory,
            autocast=self.autocast,
            device=self.device,
        )

"""The channels_last (NHWC) memory format for convolutional models: when it applies, and the
conversion of a model's 4-D weights and of every batch's 4-D floating tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn

from core.hardware.device import device_of

__all__ = ("apply_channels_last", "channels_last_batch", "has_conv2d", "wants_channels_last")


def has_conv2d(model: nn.Module) -> bool:
    """Whether the model holds an ``nn.Conv2d`` (the layers channels_last speeds up)."""
    return any(isinstance(module, nn.Conv2d) for module in model.modules())


def wants_channels_last(
    setting: Literal["auto"] | bool, model: nn.Module, device: torch.device
) -> bool:
    """Resolve the ``channels_last`` setting: ``"auto"`` is on for a model with an
    ``nn.Conv2d`` on a CUDA device; ``True`` forces it on any device; ``False`` is off."""
    if setting == "auto":
        return device_of(device).is_cuda and has_conv2d(model)
    return bool(setting)


def apply_channels_last(model: nn.Module) -> None:
    """Store the model's 4-D parameters and buffers in channels_last order, in place."""
    # Module.to accepts memory_format at run time; its type stub leaves it out.
    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]


def _convert(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.ndim == 4 and value.is_floating_point():
            return value.contiguous(memory_format=torch.channels_last)
        return value
    if isinstance(value, Mapping):
        return {key: _convert(item) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_convert(item) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_convert(item) for item in value)
    return value


def channels_last_batch(batch: Any) -> Any:
    """The batch with every 4-D floating tensor (images) in channels_last order; other
    values (targets, token ids, non-tensors) are returned untouched. Nested pairs, lists and
    dicts are walked; a tensor already in that order is not copied.
    """
    if type(batch) is tuple and len(batch) == 2:  # fast path: (inputs, targets)
        inputs, targets = batch
        if isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor):
            return (_convert(inputs), _convert(targets))
    return _convert(batch)

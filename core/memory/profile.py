"""Where a training step's memory goes, at a few batch sizes: parameters, gradients,
optimizer state, and the rest of the peak (activations).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import torch
from torch import nn

from core.checks import is_int
from core.errors import config_error
from core.memory.batches import BatchMaker, batch_maker_for_shape, check_input_shape
from core.memory.meter import meter_for
from core.memory.trial import (
    Autocast,
    LossFn,
    OptimizerFactory,
    device_for,
    preserved,
    prime_optimizer,
    run_trial,
)

__all__ = ("MemoryProfile", "default_batch_sizes", "profile_memory_usage")

_DEFAULT_SIZES = 4


class MemoryProfile(TypedDict):
    """One batch size's training step, in bytes (``None`` where it ran out of memory).

    ``activations_bytes`` is the peak less parameters, gradients and optimizer state (at
    small batch sizes the peak can be the optimizer step, leaving only its temporaries).
    """

    peak_allocated_bytes: int | None
    reserved_bytes: int | None
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int | None
    memory_used_gb: float | None
    out_of_memory: bool


def default_batch_sizes(batch_size: int) -> list[int]:
    """The largest four powers of two up to ``batch_size``, and ``batch_size`` itself: enough
    points to see how memory grows (``100``: ``[8, 16, 32, 64, 100]``)."""
    powers = [1 << k for k in range(batch_size.bit_length()) if 1 << k <= batch_size]
    return sorted({*powers[-_DEFAULT_SIZES:], batch_size})


def _bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _optimizer_state_bytes(model: nn.Module, factory: OptimizerFactory | None) -> int:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return 0
    optimizer = (factory or torch.optim.AdamW)(params)
    prime_optimizer(optimizer, params)
    seen: dict[int, torch.Tensor] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                seen.setdefault(id(value.untyped_storage()), value)
    return sum(t.untyped_storage().nbytes() for t in seen.values())


def profile_memory_usage(
    model: nn.Module,
    input_shape: Sequence[int] | None,
    batch_sizes: Sequence[int] | None = None,
    *,
    loss_fn: LossFn | None = None,
    optimizer_factory: OptimizerFactory | None = None,
    autocast: Autocast | None = None,
    device: torch.device | str | None = None,
    make_batch: BatchMaker | None = None,
) -> dict[int, MemoryProfile]:
    """Measure one training step (AdamW unless ``optimizer_factory``) at each batch size
    (default: :func:`default_batch_sizes` of ``input_shape[0]``); weights, gradients and RNG
    are kept.

    >>> profiles = profile_memory_usage(nn.Linear(784, 10), (32, 784))
    >>> sorted(profiles), profiles[32]["parameters_bytes"]
    ([4, 8, 16, 32], 31400)
    """
    given = input_shape is not None or make_batch is None
    shape = check_input_shape(input_shape) if given else None
    sizes = (
        default_batch_sizes(shape[0] if shape else 1) if batch_sizes is None else list(batch_sizes)
    )
    if not sizes or not all(is_int(n) and n >= 1 for n in sizes):
        raise config_error(
            "batch_sizes",
            batch_sizes,
            "None or a non-empty sequence of integers >= 1",
            "pass e.g. batch_sizes=[8, 16, 32], or None for powers of two up to input_shape[0].",
        )
    place = device_for(model, device)
    meter = meter_for(place)
    maker = make_batch or batch_maker_for_shape(shape or (1,), device=place)
    params = list(model.parameters())
    parameters = _bytes(params)
    gradients = _bytes([p for p in params if p.requires_grad])
    profiles: dict[int, MemoryProfile] = {}
    with preserved(model):
        state = _optimizer_state_bytes(model, optimizer_factory)
        for size in sorted(set(sizes)):
            trial = run_trial(
                model,
                maker,
                size,
                loss_fn=loss_fn,
                optimizer_factory=optimizer_factory,
                autocast=autocast,
                meter=meter,
            )
            peak = trial.peak_bytes
            rest = None if peak is None else max(0, peak - parameters - gradients - state)
            profiles[size] = MemoryProfile(
                peak_allocated_bytes=peak,
                reserved_bytes=trial.reserved_bytes,
                parameters_bytes=parameters,
                gradients_bytes=gradients,
                optimizer_state_bytes=state,
                activations_bytes=rest,
                memory_used_gb=None if peak is None else peak / 2**30,
                out_of_memory=peak is None,
            )
    return profiles

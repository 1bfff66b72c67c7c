"""Batches of any size for memory trials: random ones from an input shape, or a real batch
tiled along the sample dimension.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from core.checks import is_int
from core.data.batches import count_samples
from core.errors import config_error

__all__ = ("BatchMaker", "batch_maker_for_shape", "batch_maker_from", "check_input_shape")

BatchMaker = Callable[[int], Any]  # a batch of n samples: a tensor, an (x, y) pair or a dict


def check_input_shape(input_shape: Sequence[int] | None) -> tuple[int, ...]:
    """``input_shape`` as a tuple, after checking it is ``(batch, features...)`` of ints >= 1."""
    shape = tuple(input_shape) if isinstance(input_shape, (tuple, list, torch.Size)) else ()
    if not shape or not all(is_int(d) and d >= 1 for d in shape):
        raise config_error(
            "input_shape",
            input_shape,
            "a tuple of integers >= 1, the batch size first: (batch, features...)",
            "pass e.g. input_shape=(32, 784) or (32, 3, 224, 224).",
        )
    return shape


def batch_maker_for_shape(
    input_shape: Sequence[int],
    *,
    input_dtype: torch.dtype = torch.float32,
    vocab_size: int | None = None,
    device: torch.device | str | None = None,
) -> BatchMaker:
    """Random inputs of ``input_shape`` with dimension 0 replaced by ``n``: standard normal
    floats, or token ids in ``[0, vocab_size)`` when ``input_dtype`` is an integer type."""
    rest = check_input_shape(input_shape)[1:]
    integer = not (input_dtype.is_floating_point or input_dtype.is_complex)
    if integer and not (is_int(vocab_size) and vocab_size >= 1):
        raise config_error(
            "vocab_size",
            vocab_size,
            f"an integer >= 1 for input_dtype={input_dtype}",
            "pass the number of token ids, e.g. vocab_size=50304, or a floating input_dtype.",
        )
    place = torch.device(device) if device is not None else None
    vocab = vocab_size if is_int(vocab_size) else 0

    def make(n: int) -> torch.Tensor:
        if integer:
            return torch.randint(0, vocab, (n, *rest), dtype=input_dtype, device=place)
        return torch.randn(n, *rest, dtype=input_dtype, device=place)

    return make


def batch_maker_from(batch: Any) -> BatchMaker:
    """Batches of ``n`` samples repeating ``batch``'s samples in order (tensors whose
    dimension 0 is not the sample count are shared)."""
    size = count_samples(batch)

    def make(n: int) -> Any:
        return _tile(batch, size, n)

    return make


def _tile(value: Any, size: int, n: int) -> Any:
    if isinstance(value, torch.Tensor):
        if value.ndim == 0 or value.shape[0] != size:
            return value
        index = torch.arange(n, device=value.device) % size
        return value.index_select(0, index)
    if isinstance(value, Mapping):
        return {k: _tile(v, size, n) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_tile(v, size, n) for v in value)
    return value

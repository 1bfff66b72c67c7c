"""What a batch is, and the three things done to one: count, move, split.

A batch is either an ``(inputs, targets)`` pair (tuple or list of length 2) or a mapping of
keyword arguments for a model that returns its own loss. ``inputs`` and the mapping's values
may be tensors or nested tuples/lists/dicts of tensors; dimension 0 is the sample dimension.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from core.errors import BatchFormatError

__all__ = (
    "check_batch",
    "count_samples",
    "count_tokens",
    "describe",
    "is_pair",
    "leaves",
    "split_batch",
    "take_samples",
    "tensors_of",
    "to_device",
)


def is_pair(batch: object) -> bool:
    return isinstance(batch, (tuple, list)) and len(batch) == 2


def describe(value: object) -> str:
    """A short description of a value's structure for error messages."""
    if isinstance(value, torch.Tensor):
        return f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k!r}: {describe(v)}" for k, v in list(value.items())[:4])
        return "{" + inner + "}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe(v) for v in value[:4])
        more = ", ..." if len(value) > 4 else ""
        return f"{type(value).__name__} of {len(value)} [{inner}{more}]"
    return type(value).__name__


def check_batch(batch: Any, *, epoch: int, batch_index: int) -> Any:
    """Return ``batch`` if it is an ``(inputs, targets)`` pair or a mapping; else raise
    :class:`~core.errors.BatchFormatError`."""
    if isinstance(batch, Mapping) or (isinstance(batch, (tuple, list)) and len(batch) == 2):
        return batch
    raise BatchFormatError(
        f"batch {batch_index} of epoch {epoch} is {describe(batch)}; allowed: an "
        "(inputs, targets) tuple or list, or a dict of keyword arguments for a model "
        "that returns its own loss. Fix: make the dataset return (inputs, target) pairs "
        "or pass a collate_fn that builds one of these forms."
    )


def leaves(value: Any) -> Iterator[Any]:
    """Every leaf of a nested batch or sample (tuples, lists, dicts), in order."""
    if isinstance(value, Mapping):
        for item in value.values():
            yield from leaves(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from leaves(item)
    else:
        yield value


def tensors_of(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor of a nested batch, in order."""
    return (leaf for leaf in leaves(value) if isinstance(leaf, torch.Tensor))


def count_samples(batch: object) -> int:
    """Number of samples in a batch: dimension 0 of its first tensor (targets first)."""
    if (
        isinstance(batch, (tuple, list))
        and len(batch) == 2
        and isinstance(batch[1], torch.Tensor)
        and batch[1].ndim > 0
    ):
        return int(batch[1].shape[0])  # the common case: (inputs, targets tensor)
    targets = batch[1] if isinstance(batch, (tuple, list)) and len(batch) == 2 else None
    tensor = next(tensors_of(targets), None)
    if tensor is None or tensor.ndim == 0:
        tensor = next(tensors_of(batch), None)
    if tensor is None or tensor.ndim == 0:
        raise BatchFormatError(
            f"cannot count the samples of batch {describe(batch)}: it holds no tensor with a "
            "sample dimension. Batches must be (inputs, targets) with tensors whose dimension 0 "
            "is the batch, or a dict of such tensors."
        )
    return int(tensor.shape[0])


def count_tokens(batch: object, ignore_index: int) -> int | torch.Tensor:
    """Target tokens not equal to ``ignore_index``: of ``targets`` in a pair, of
    ``batch["labels"]`` in a mapping (Hugging Face's name). An int for CPU targets (no
    device sync); a 0-d device tensor for targets already on an accelerator."""
    targets = batch.get("labels") if isinstance(batch, Mapping) else None
    if is_pair(batch):
        targets = batch[1]  # type: ignore[index]
    if not isinstance(targets, torch.Tensor):
        raise BatchFormatError(
            f"normalize_by='tokens' needs target tokens, but batch {describe(batch)} has "
            "none: allowed: an (inputs, targets) pair with a targets tensor, or a dict with "
            "a 'labels' tensor. Fix: return targets from the dataset, or use "
            "normalize_by='samples'."
        )
    counted = (targets != ignore_index).sum()
    return int(counted) if counted.device.type == "cpu" else counted


def to_device(value: Any, device: torch.device) -> Any:
    """Move every tensor in a nested structure to ``device`` (asynchronously when pinned)."""
    if isinstance(value, torch.Tensor):
        return value if value.device == device else value.to(device, non_blocking=True)
    if type(value) is tuple:
        for item in value:  # a loop, not all(...): no generator to resume on every step
            if not (isinstance(item, torch.Tensor) and item.device == device):
                break
        else:
            return value  # fast path: already there
    if isinstance(value, Mapping):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    return value


def _split(value: Any, size: int, sections: int) -> list[Any]:
    if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == size:
        return list(torch.tensor_split(value, sections))
    if isinstance(value, Mapping):
        parts = {k: _split(v, size, sections) for k, v in value.items()}
        return [{k: parts[k][i] for k in parts} for i in range(sections)]
    if isinstance(value, (tuple, list)):
        columns = [_split(v, size, sections) for v in value]
        return [type(value)(col[i] for col in columns) for i in range(sections)]
    return [value] * sections


def split_batch(batch: Any, max_size: int) -> list[Any]:
    """Split a batch along the sample dimension into chunks of at most ``max_size`` samples.

    Tensors whose dimension 0 is not the batch size (and non-tensors) are shared by all
    chunks.
    """
    size = count_samples(batch)
    if size <= max_size:
        return [batch]
    sections = -(-size // max_size)
    return _split(batch, size, sections)


def _take(value: Any, size: int, keep: int) -> Any:
    if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == size:
        return value[:keep]
    if isinstance(value, Mapping):
        return {k: _take(v, size, keep) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_take(v, size, keep) for v in value)
    return value


def take_samples(batch: Any, keep: int) -> Any:
    """The first ``keep`` samples of a batch (views, no copy)."""
    return _take(batch, count_samples(batch), keep)

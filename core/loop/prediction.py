"""Prediction: the model's outputs for every batch of a loader, in loader order, on the CPU.

Shaped like ``core.loop.evaluation``: under a distributed strategy each rank predicts its
shard; samples that only pad a shard still run forward (FSDP2 needs every rank in every
all-gather) but their outputs are dropped.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

import torch
from torch import nn

from core.data.batches import count_samples, describe, take_samples, to_device
from core.distributed import Strategy
from core.errors import BatchFormatError
from core.precision.plugins import Precision

__all__ = ("predict",)


def _forward(model: nn.Module, batch: Any) -> Any:
    """``model(**batch)`` for a mapping, ``model(batch[0])`` for a tuple or list (inputs
    first, targets ignored), ``model(batch)`` for a tensor."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)) and batch:
        return model(batch[0])
    if isinstance(batch, torch.Tensor):
        return model(batch)
    raise BatchFormatError(
        f"cannot predict on batch {describe(batch)}: allowed: a tensor of inputs, an "
        "(inputs, targets) tuple or list (targets are ignored), or a dict of keyword "
        "arguments for the model. Fix: make the loader yield one of these."
    )


def _to_host(value: Any) -> Any:
    """Every tensor in ``value`` detached and on the CPU; containers keep their types
    (tuples, named tuples, lists, dicts and dict subclasses such as Hugging Face's
    ``ModelOutput``)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        copied = copy.copy(value)  # same class, same attributes (ModelOutput mirrors keys)
        for key, item in value.items():
            copied[key] = _to_host(item)
        return copied
    if isinstance(value, Mapping):
        return {key: _to_host(item) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_to_host(item) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_to_host(item) for item in value)
    return value


@torch.no_grad()
def predict(
    model: nn.Module,
    loader: Iterable[Any],
    *,
    precision: Precision,
    strategy: Strategy,
    prepare_batch: Callable[[Any], Any] | None = None,
    stop: threading.Event | None = None,
) -> list[Any]:
    """The outputs of ``model`` for each batch of ``loader``, in loader order: every tensor
    in them detached and on the CPU, containers as the model returned them.

    Runs under ``torch.no_grad()`` (not ``inference_mode``, which some compiled and FSDP2
    paths reject) in eval mode, restoring the model's previous mode at the end, with the
    precision's autocast. A batch is a tensor (``model(batch)``), a tuple or list whose
    first item is the inputs (``model(inputs)``; targets are ignored), or a mapping
    (``model(**batch)``). ``prepare_batch`` moves a batch to the device (default: every
    tensor to ``strategy.device``). Setting ``stop`` ends the pass early (at a batch
    boundary, all ranks together) and returns the outputs so far.

    >>> model = nn.Linear(3, 2)
    >>> cpu = Strategy(torch.device("cpu"))
    >>> [o.shape for o in predict(model, [torch.ones(4, 3)], precision=Precision(), strategy=cpu)]
    [torch.Size([4, 2])]
    """
    was_training = model.training
    model.eval()
    prepare = prepare_batch or partial(to_device, device=strategy.device)
    limit = strategy.eval_sample_limit(loader)
    samples = 0
    outputs: list[Any] = []
    try:
        for raw in loader:
            batch = prepare(raw)
            keep = None
            if limit is not None:
                size = count_samples(batch)
                keep = max(0, min(size, limit - samples))
                if 0 < keep < size:
                    batch = take_samples(batch, keep)
                samples += keep
            with precision.autocast():
                result = _forward(model, batch)
            if keep != 0:
                # Host sync, once per batch: outputs are returned on the CPU, and the
                # device memory they held is free for the next batch.
                outputs.append(_to_host(result))
            if strategy.should_stop(stop is not None and stop.is_set()):
                break
        strategy.settle_stop_votes()
    finally:
        model.train(was_training)
    return outputs

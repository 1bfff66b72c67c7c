"""Measuring a built run without changing it: the time of forward, backward and optimizer
step on the run's own batches (``benchmark_performance``), and the largest batch size within
a share of the device's memory (``get_optimal_batch_size``).

Both run on the calling thread, between ``train()`` calls, and leave the weights, gradients,
optimizer state, loss scale and every RNG as they were.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

import torch

from core.checks import is_int, is_number
from core.config import TrainingConfig
from core.data.batches import count_samples
from core.errors import config_error
from core.hardware.device import device_of
from core.loop.step import build_update
from core.memory.batches import batch_maker_from
from core.memory.finder import find_batch_size
from core.memory.trial import preserved
from core.trainer.assembly.build import Parts
from core.trainer.assembly.model_setup import first_batch, optimizer_factory_like

__all__ = ("benchmark_performance", "optimal_batch_size")


def _timer(device: torch.device) -> Callable[[], float]:
    """A clock that first waits for ``device`` (the sync is what a benchmark is for: else a
    CUDA phase is timed as the moment its kernels were queued)."""
    if not device_of(device).is_cuda:
        return perf_counter

    def clock() -> float:
        torch.cuda.synchronize(device)
        return perf_counter()

    return clock


def _batches(parts: Parts) -> Iterator[Any]:
    """The run's training batches, over and over."""
    loader = parts.train_loader
    first = iter(loader)
    try:
        head = next(first)
    except StopIteration:
        raise config_error(
            "train_loader", loader, "a loader with at least one batch", "check the dataset."
        ) from None
    return itertools.chain([head], first, itertools.chain.from_iterable(itertools.repeat(loader)))


def benchmark_performance(
    parts: Parts, config: TrainingConfig, num_iterations: int
) -> dict[str, Any]:
    """Seconds of forward and loss, backward, and optimizer step (unscale and clipping
    included), each averaged over ``num_iterations`` steps after one warm-up step, on the train
    loader's batches in order. A loader batch runs as one forward (no ``micro_batch_size``
    split); ``batch_size`` is the first batch's samples. Under DDP every rank must call it.
    """
    if not (is_int(num_iterations) and num_iterations >= 1):
        raise config_error("num_iterations", num_iterations, "an integer >= 1", "e.g. 100.")
    model, optimizer, strategy = parts.model, parts.optimizer, parts.strategy
    precision = parts.policy.precision
    optimizer_state = copy.deepcopy(optimizer.state_dict())
    precision_state = copy.deepcopy(precision.state_dict())
    params = [p for p in model.parameters() if p.requires_grad]
    update = build_update(
        optimizer, strategy, optim=config.optim, guard_nonfinite=False, params=params
    )
    clock = _timer(strategy.device)
    times = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    samples = 0
    was_training = model.training
    model.train()
    try:
        with preserved(strategy.unwrap(model)):  # weights, gradients, every RNG (loader too)
            batches = _batches(parts)
            for index in range(num_iterations + 1):
                batch = parts.prepared.prepare_batch(next(batches))
                samples = samples or count_samples(batch)
                start = clock()
                with precision.autocast():
                    _, loss = parts.objective(model, batch)
                loss = parts.errors.check_loss(
                    loss, epoch=0, batch_index=index, source=parts.objective.loss_source_of(batch)
                )
                forward = clock()
                precision.backward(loss)
                backward = clock()
                update.apply(precision)  # unscale, clip, step, scale, zero_grad
                done = clock()
                if index:  # the first step warms up
                    times["forward"] += forward - start
                    times["backward"] += backward - forward
                    times["optimizer"] += done - backward
    finally:
        optimizer.load_state_dict(optimizer_state)
        precision.load_state_dict(precision_state)
        model.train(was_training)
    step = sum(times.values()) / num_iterations
    return {
        "average_forward_time": times["forward"] / num_iterations,
        "average_backward_time": times["backward"] / num_iterations,
        "average_optimizer_time": times["optimizer"] / num_iterations,
        "average_step_time": step,
        "samples_per_second": samples / step if step > 0 else None,
        "iterations": num_iterations,
        "batch_size": samples,
        "device": str(strategy.device),
        "precision": precision.name,
    }


def optimal_batch_size(parts: Parts, config: TrainingConfig, target_memory_usage: float) -> int:
    """The largest batch size whose training step (the run's precision and loss, a fresh
    optimizer of its class) uses at most ``target_memory_usage`` of the device's memory (CUDA:
    free plus what torch holds; CPU: ``MemAvailable``), up to ``config.memory.max_batch_size``.
    Under several ranks every rank calls it and all get the smallest answer."""
    if not (is_number(target_memory_usage) and 0 < target_memory_usage <= 1):
        raise config_error(
            "target_memory_usage",
            target_memory_usage,
            "a fraction in (0, 1]",
            "e.g. 0.8 to use at most 80% of the device's memory.",
        )
    first = first_batch(parts.train_loader)
    model = parts.strategy.unwrap(parts.model)
    search = find_batch_size(
        model,
        None,
        None,
        config.memory.max_batch_size,
        1.0 - float(target_memory_usage),
        loss_fn=parts.objective.loss,
        optimizer_factory=optimizer_factory_like(parts.optimizer),
        autocast=parts.policy.precision.autocast,
        device=parts.strategy.device,
        make_batch=batch_maker_from(first),
    )
    return search.batch_size

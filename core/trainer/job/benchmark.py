"""Measuring a built run without changing it: the time of forward, backward and optimizer
step on the run's own batches (``benchmark_performance``), and the largest batch size within
a share of the device's memory (``get_optimal_batch_size``).

Both run synchronously on the calling thread, between ``train()`` calls; the model's weights,
its gradients, the optimizer's state, the loss scale and every RNG are as before when they
return, so training is unaffected.

Example::

    run = TrainingJob(config, model=model, train_loader=loader)
    run.benchmark_performance(num_iterations=20)["average_forward_time"]
    run.get_optimal_batch_size(target_memory_usage=0.8)
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
from core.rng import capture_rng, restore_rng
from core.trainer.assembly.build import Parts
from core.trainer.assembly.model_setup import optimizer_factory_like

__all__ = ("benchmark_performance", "optimal_batch_size")


def _timer(device: torch.device) -> Callable[[], float]:
    """A clock that first waits for ``device``: without the wait, a CUDA phase would be
    timed as the moment its kernels were queued. The sync is what a benchmark is for."""
    if not device_of(device).is_cuda:
        return perf_counter

    def clock() -> float:
        torch.cuda.synchronize(device)
        return perf_counter()

    return clock


def _batches(parts: Parts) -> Iterator[Any]:
    """The run's training batches, over and over (a loader read whole, epoch after epoch)."""
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
    """Time ``num_iterations`` training steps of the run's model on its training batches, in
    its precision: forward and loss, backward, and the optimizer step (unscale, gradient
    norm and clipping included), each averaged in seconds. One step runs first to warm up
    (allocations, lazy optimizer state, autotuning) and is not counted; batches come from
    the train loader in order, repeating it when it runs out. Weights, gradients, optimizer
    state, loss scale and RNG are restored afterwards (the train loader's shuffle order
    too: a sampler draws it from torch's generator).

    ``samples_per_second`` is the batch's samples over the mean step time; ``batch_size``
    the first batch's samples. A loader batch runs as one forward (without the run's
    ``micro_batch_size`` split). Under DDP every rank must call it (backward all-reduces).

    Example::

        benchmark_performance(parts, config, 10)["average_backward_time"]
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
                    loss, epoch=0, batch_index=index, source=parts.objective.loss_source
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
    """The largest batch size whose training step of the run's model (in its precision,
    with its loss and a fresh optimizer of its optimizer's class) uses at most
    ``target_memory_usage`` of the device's memory: on CUDA of the free memory plus what
    torch already holds (the model, its cache), on CPU of the available RAM (``MemAvailable``).
    Searched from the first training batch's size up to ``config.memory.max_batch_size``
    (:func:`~core.memory.find_batch_size`); the answer is per process (under several ranks,
    every rank calls it and all get the smallest answer). Weights and RNG are restored.

    Example::

        optimal_batch_size(parts, config, 0.8)
    """
    if not (is_number(target_memory_usage) and 0 < target_memory_usage <= 1):
        raise config_error(
            "target_memory_usage",
            target_memory_usage,
            "a fraction in (0, 1]",
            "e.g. 0.8 to use at most 80% of the device's memory.",
        )
    state = capture_rng()  # a shuffling loader draws its order: the run must not notice
    try:
        first = next(iter(parts.train_loader))
    finally:
        restore_rng(state)
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

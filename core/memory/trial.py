"""One full training step at a given batch size, measured: the unit of every memory search.
Out of memory means "does not fit"; :func:`preserved` restores the model and RNGs afterwards.
"""

from __future__ import annotations

import contextlib
import copy
import gc
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from core.data.batches import describe, is_pair, to_device
from core.errors import LossFormatError
from core.hardware.device import device_of
from core.loop.recovery import is_out_of_memory
from core.memory.batches import BatchMaker
from core.memory.meter import MemoryMeter
from core.rng import capture_rng, restore_rng

__all__ = (
    "Autocast",
    "LossFn",
    "OptimizerFactory",
    "Trial",
    "device_for",
    "preserved",
    "prime_optimizer",
    "run_trial",
)

LossFn = Callable[[Any, Any], torch.Tensor]
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
Autocast = Callable[[], AbstractContextManager[object]]


@dataclass(frozen=True)
class Trial:
    """One measured training step: ``fits`` when it neither ran out of memory (``peak_bytes``
    ``None``) nor passed the target; ``reason`` says why."""

    batch_size: int
    fits: bool
    peak_bytes: int | None
    reason: str
    reserved_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "fits": self.fits,
            "peak_bytes": self.peak_bytes,
            "reason": self.reason,
            "reserved_bytes": self.reserved_bytes,
        }


def device_for(model: nn.Module, device: torch.device | str | None) -> torch.device:
    """``device``, else the device of the model's first parameter (CPU without one)."""
    if device is not None:
        return torch.device(device)
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


@contextlib.contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Restore ``model``'s weights and buffers, its gradients and every RNG on exit;
    gradients are ``None`` inside (a real step starts without them)."""
    # A host copy: a snapshot on the device would count against the memory being measured
    # (on CUDA this copy waits for the device, once per search).
    snapshot = {
        name: value.detach().to("cpu", copy=True)
        if isinstance(value, torch.Tensor)
        else copy.deepcopy(value)
        for name, value in model.state_dict().items()
    }
    rng = capture_rng()
    grads = [(p, p.grad) for p in model.parameters()]
    for param, _grad in grads:
        param.grad = None
    try:
        yield
    finally:
        model.load_state_dict(snapshot)
        for param, grad in grads:
            param.grad = grad
        restore_rng(rng)


def prime_optimizer(optimizer: torch.optim.Optimizer, params: Iterable[nn.Parameter]) -> None:
    """Make ``optimizer`` allocate its state with one step on zero gradients, so that one
    measured step counts it (weights move by weight decay only)."""
    chosen = list(params)
    for param in chosen:
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def run_trial(
    model: nn.Module,
    make_batch: BatchMaker,
    batch_size: int,
    *,
    loss_fn: LossFn | None = None,
    optimizer_factory: OptimizerFactory | None = None,
    autocast: Autocast | None = None,
    meter: MemoryMeter,
    target_bytes: int | None = None,
) -> Trial:
    """Run and measure one training step with ``batch_size`` samples, with a throwaway
    optimizer (default AdamW); with ``target_bytes``, a peak above it does not fit either.

    >>> run_trial(model, batch_maker_for_shape((32, 784)), 64, meter=meter_for("cpu")).fits
    """
    params = [p for p in model.parameters() if p.requires_grad]
    factory = optimizer_factory or torch.optim.AdamW
    optimizer = factory(params) if params else None
    context = autocast or contextlib.nullcontext
    device = meter.device

    def step() -> None:
        if optimizer is not None:
            prime_optimizer(optimizer, params)
        batch = to_device(make_batch(batch_size), device)  # held to the end, as a run does
        with context():
            loss = _loss(model, batch, loss_fn)
        loss.backward()
        del loss
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    resident = [*model.parameters(), *model.buffers()]
    failure: str | None = None
    try:
        reading = meter.measure(step, resident=resident)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        lines = str(exc).strip().splitlines()
        failure = f"out of memory: {type(exc).__name__}: {lines[0] if lines else ''}"
    finally:
        _free(optimizer, params, device, full=failure is not None)
        optimizer = None
    if failure is not None:
        return Trial(batch_size, False, None, failure)
    peak, reserved = reading.peak_bytes, reading.reserved_bytes
    if target_bytes is not None and peak > target_bytes:
        reason = f"peak {_gib(peak)} > target {_gib(target_bytes)}"
        return Trial(batch_size, False, peak, reason, reserved)
    limit = f" <= target {_gib(target_bytes)}" if target_bytes is not None else ""
    return Trial(batch_size, True, peak, f"peak {_gib(peak)}{limit}", reserved)


def _free(
    optimizer: torch.optim.Optimizer | None,
    params: list[nn.Parameter],
    device: torch.device,
    *,
    full: bool,
) -> None:
    if optimizer is not None:
        optimizer.state.clear()  # an optimizer sits in a reference cycle
    for param in params:
        param.grad = None
    # A full collection (about 0.2 s) only after an out-of-memory error, whose traceback
    # keeps the step's tensors in cycles.
    gc.collect(2 if full else 1)
    device_of(device).empty_cache()


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB"


def _loss(model: nn.Module, batch: Any, loss_fn: LossFn | None) -> torch.Tensor:
    """The batch's loss as the run computes it, or a synthetic one."""
    if isinstance(batch, Mapping):
        outputs = model(**batch)
        own = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        own = getattr(outputs, "loss", own)
        if isinstance(own, torch.Tensor) and own.ndim == 0 and own.is_floating_point():
            return own
        return _synthetic_loss(outputs)
    if is_pair(batch):
        inputs, targets = batch
        outputs = model(inputs)
        return loss_fn(outputs, targets) if loss_fn is not None else _synthetic_loss(outputs)
    return _synthetic_loss(model(batch))


def _synthetic_loss(outputs: Any) -> torch.Tensor:
    terms = [t.float().mean() for t in _tensors(outputs) if t.is_floating_point()]
    terms = [t for t in terms if t.requires_grad]
    if not terms:
        raise LossFormatError(
            f"the model's outputs, {describe(outputs)}, hold no floating tensor that needs a "
            "gradient, so a memory trial cannot run backward. Fix: pass loss_fn, or a "
            "make_batch whose batches are (inputs, targets) pairs or dicts the model turns "
            "into its loss."
        )
    return torch.stack(terms).sum()


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for child in value.values():
            yield from _tensors(child)
    elif isinstance(value, (tuple, list)):
        for child in value:
            yield from _tensors(child)

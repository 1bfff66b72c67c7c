"""The largest batch size whose full training step fits a memory target. A secant search on the
measured peaks (near affine in the batch size), safeguarded by doubling and bisection; the
answer is always a measured fit, in at most :data:`MAX_TRIALS` trials (usually 5 to 9).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from core.errors import OutOfMemoryError
from core.memory.batches import BatchMaker, batch_maker_for_shape, check_input_shape
from core.memory.config import MemoryConfig
from core.memory.meter import meter_for
from core.memory.trial import (
    Autocast,
    LossFn,
    OptimizerFactory,
    Trial,
    device_for,
    preserved,
    run_trial,
)

__all__ = ("BatchSizeSearch", "MAX_TRIALS", "find_batch_size", "optimize_batch_size")

MAX_TRIALS = 12  # more only while sizes keep failing on the way down to 1
_GROWTH_CAP = 8  # the most a size grows per trial before any failure bounds the search
_SLOW_LIMIT = 3  # slow marks (see _Search._judge) before predictions are set aside
_FLAT = 1 << 62  # "no limit in sight": peaks that do not grow with the batch size


@dataclass(frozen=True)
class BatchSizeSearch:
    """The answer of a search, the trials behind it, and the target they were held to."""

    batch_size: int
    trials: tuple[Trial, ...]
    target_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "target_bytes": self.target_bytes,
            "trials": [trial.to_dict() for trial in self.trials],
        }


class _Search:
    """A safeguarded secant search over trial outcomes."""

    def __init__(self, probe: Callable[[int], Trial], start: int, limit: int, target: int):
        self.probe, self.start, self.limit, self.target = probe, min(start, limit), limit, target
        self.trials: list[Trial] = []
        self.slow = 0  # predictions that did not halve the bracket
        self.bisect_next = False

    @property
    def lo(self) -> int | None:
        return max((t.batch_size for t in self.trials if t.fits), default=None)

    @property
    def hi(self) -> int | None:
        return min((t.batch_size for t in self.trials if not t.fits), default=None)

    def run(self) -> int:
        while (lo := self.lo) is None or not self._done(lo):
            if lo is None and self.hi == 1:
                raise self._nothing_fits()
            hi_before, size, predicted = self.hi, *self._next_size()
            self.trials.append(self.probe(size))
            self._judge(predicted, size, lo, hi_before)
        return lo

    def _done(self, lo: int) -> bool:
        hi = self.hi
        closed = lo >= self.limit or (hi is not None and hi - lo <= 1)
        return closed or len(self.trials) >= MAX_TRIALS

    def _judge(self, predicted: bool, size: int, lo: int | None, hi: int | None) -> None:
        """Count a prediction that did not halve the bracket as slow, and one that crept up
        by a single sample (and fit) as twice that, bisecting next; three slow marks in a
        row stop the predictions until one halves the bracket again."""
        self.bisect_next = False
        if not predicted or lo is None:
            return
        crept = self.trials[-1].fits and size == lo + 1
        lo_now, hi_now = self.lo, self.hi
        if crept:
            self.slow += 2
            self.bisect_next = True
        elif hi is None or hi_now is None or lo_now is None or 2 * (hi_now - lo_now) <= hi - lo:
            self.slow = 0  # growing without a bracket yet, or the bracket halved
        else:
            self.slow += 1

    def _next_size(self) -> tuple[int, bool]:
        if not self.trials:
            return self.start, False
        lo, hi, guess = self.lo, self.hi, self._predict()
        if lo is None:  # nothing fits yet: go down, at least halving
            assert hi is not None  # a first trial that did not fit
            return (hi // 2, False) if guess is None else (max(1, min(guess, hi // 2)), True)
        upper = hi - 1 if hi is not None else self.limit
        distrust = self.bisect_next or self.slow >= _SLOW_LIMIT
        if guess is None or distrust or (hi is not None and guess >= hi):
            predicted = False
            if hi is None:
                size = 2 * lo
            else:  # geometric steps across a wide bracket, halves across a narrow one
                size = int((lo * hi) ** 0.5) if hi > 4 * lo else (lo + hi) // 2
        else:
            predicted = True
            size = guess if hi is not None else min(guess, _GROWTH_CAP * lo)
        return max(lo + 1, min(size, upper)), predicted

    def _predict(self) -> int | None:
        """Where an affine fit of two measured peaks crosses the target: the largest fit and
        the smallest failure around it, or two fits far apart (at least 2x)."""
        measured = sorted(
            (t for t in self.trials if t.peak_bytes is not None), key=lambda t: t.batch_size
        )
        fits = [t for t in measured if t.fits]
        fails = [t for t in measured if not t.fits]
        if fits and fails:
            a, b = fits[-1], fails[0]
        elif len(fits) >= 2:
            b = fits[-1]
            a = next((t for t in reversed(fits) if 2 * t.batch_size <= b.batch_size), fits[0])
        elif len(fails) >= 2:
            a, b = fails[0], fails[1]
        else:
            return None
        assert a.peak_bytes is not None and b.peak_bytes is not None  # filtered above
        slope = (b.peak_bytes - a.peak_bytes) / (b.batch_size - a.batch_size)
        if slope <= 0:
            return _FLAT if b.peak_bytes <= self.target else None
        return b.batch_size + int((self.target - b.peak_bytes) // slope)

    def _nothing_fits(self) -> OutOfMemoryError:
        tried = ", ".join(f"{t.batch_size} ({t.reason})" for t in self.trials)
        return OutOfMemoryError(
            f"no batch size fits: a training step with 1 sample already needs more than the "
            f"target of {self.target / 2**30:.3f} GiB. Tried: {tried}. Fix: raise "
            "target_memory_gb (or lower margin), enable activation checkpointing, use bf16, "
            "a smaller model, or a device with more memory."
        )


def _agree_min(batch_size: int) -> int:
    """The smallest answer of all ranks under an initialised process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return batch_size
    nccl = dist.get_backend() == "nccl"
    place = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    value = torch.tensor([batch_size], dtype=torch.int64, device=place)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())  # host sync: the agreed size is a Python int, once per search


def find_batch_size(
    model: nn.Module,
    input_shape: Sequence[int] | None,
    target_memory_gb: float | None = None,
    max_batch_size: int = 4096,
    margin: float = 0.1,
    *,
    loss_fn: LossFn | None = None,
    optimizer_factory: OptimizerFactory | None = None,
    autocast: Autocast | None = None,
    device: torch.device | str | None = None,
    make_batch: BatchMaker | None = None,
    agree: Callable[[int], int] | None = None,
) -> BatchSizeSearch:
    """Search for the largest batch size whose training step fits the target; weights,
    gradients and RNG are as before when it returns.

    The search starts at ``input_shape[0]`` (1 when ``None``, which needs ``make_batch``).
    ``target_memory_gb=None``: the device's free memory less ``margin``. Under a process
    group every rank must call it; all take the smallest answer (or ``agree``'s).

    >>> find_batch_size(model, (32, 784), target_memory_gb=1.0).batch_size  # doctest: +SKIP
    """
    config = MemoryConfig(
        target_memory_gb=target_memory_gb, max_batch_size=max_batch_size, margin=margin
    )
    given = input_shape is not None or make_batch is None
    shape = check_input_shape(input_shape) if given else None
    place = device_for(model, device)
    meter = meter_for(place)
    target = config.target_bytes
    if target is None:
        target = meter.budget_default(config.margin)
    maker = make_batch or batch_maker_for_shape(shape or (1,), device=place)

    def probe(size: int) -> Trial:
        return run_trial(
            model,
            maker,
            size,
            loss_fn=loss_fn,
            optimizer_factory=optimizer_factory,
            autocast=autocast,
            meter=meter,
            target_bytes=target,
        )

    search = _Search(probe, shape[0] if shape else 1, config.max_batch_size, target)
    with preserved(model):
        found = search.run()
    agreed = (agree or _agree_min)(found)
    return BatchSizeSearch(batch_size=agreed, trials=tuple(search.trials), target_bytes=target)


def optimize_batch_size(
    model: nn.Module,
    input_shape: Sequence[int] | None,
    target_memory_gb: float | None = None,
    max_batch_size: int = 4096,
    margin: float = 0.1,
    *,
    loss_fn: LossFn | None = None,
    optimizer_factory: OptimizerFactory | None = None,
    autocast: Autocast | None = None,
    device: torch.device | str | None = None,
    make_batch: BatchMaker | None = None,
    agree: Callable[[int], int] | None = None,
) -> int:
    """:func:`find_batch_size`'s answer alone: ``optimize_batch_size(model, (32, 784))``."""
    return find_batch_size(
        model,
        input_shape,
        target_memory_gb,
        max_batch_size,
        margin,
        loss_fn=loss_fn,
        optimizer_factory=optimizer_factory,
        autocast=autocast,
        device=device,
        make_batch=make_batch,
        agree=agree,
    ).batch_size

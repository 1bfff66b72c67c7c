"""The metric contract: a ``Metric`` adds per-batch sums into a small float64 tensor on the
device, and computes its value on the host from those sums summed over every rank. Additive
state has the same global value on one process as on many, and every metric travels in one
all-reduce. ``MeanOf`` turns a plain function ``(outputs, targets) -> Tensor`` into a Metric.

A user-defined metric, the mean squared error::

    class MeanSquaredError(Metric):
        def __init__(self) -> None:
            super().__init__(size=2)  # [sum of squared errors, number of elements]

        def update(self, outputs, targets):
            squared = (outputs.float() - targets.float()).square()
            count = torch.full((), squared.numel(), device=squared.device)
            self.add(torch.stack([squared.sum(dtype=torch.float64), count.double()]))

        def compute(self, state):
            total, count = state.tolist()
            return total / count if count else None
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import override

from core.checks import is_number
from core.data.batches import count_samples, describe

__all__ = ("MeanOf", "Metric", "MetricFn")

MetricFn = Callable[[Any, Any], Any]


class Metric(ABC):
    """A metric accumulated on the device, reduced over ranks as a sum, computed on the host.

    Subclasses call ``super().__init__(size)`` (the length of the state, fixed so that the
    states of every rank line up), and implement :meth:`update` (device ops only: add this
    batch's sums with :meth:`add`; never ``.item()``) and :meth:`compute` (from the summed
    state, on the host; None where the value is undefined, e.g. nothing was counted).
    :meth:`state` and :meth:`reset` are provided.

    ``classes_last`` is set by :class:`~core.metrics.MetricSet` before each update: True for
    dict batches (Hugging Face models put class scores in the last dimension), False for
    ``(inputs, targets)`` batches (class dimension 1, as ``nn.CrossEntropyLoss`` reads it).

    >>> hits = MeanOf(lambda outputs, targets: outputs.argmax(1) == targets)
    >>> hits.update(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
    >>> hits.compute(hits.state())
    0.5
    """

    classes_last: bool = False

    def __init__(self, size: int) -> None:
        self.size = size
        self._sums: torch.Tensor | None = None
        self._device: torch.device | None = None

    @abstractmethod
    def update(self, outputs: Any, targets: Any) -> None:
        """Add one batch's sums (with :meth:`add`); device ops only, no host sync."""

    @abstractmethod
    def compute(self, state: torch.Tensor) -> float | None:
        """The value from a summed state (a 1-D CPU float64 tensor of length ``size``)."""

    def add(self, values: torch.Tensor) -> None:
        """Add ``size`` numbers to the state (out of place: ``values`` is never modified)."""
        values = values.detach().reshape(-1).to(self._device or values.device, torch.float64)
        if values.numel() != self.size:
            raise ValueError(
                f"{self!r} added {values.numel()} numbers to a state of size {self.size}; "
                f"allowed: exactly {self.size}. Fix: make update() add a tensor of the size "
                "given to Metric.__init__."
            )
        self._sums = values if self._sums is None else self._sums + values

    def state(self) -> torch.Tensor:
        """The sums so far: a 1-D float64 tensor of length ``size`` on the device (zeros on
        the device given to :meth:`reset` before any update). Read it, do not modify it."""
        if self._sums is not None:
            return self._sums
        return torch.zeros(self.size, dtype=torch.float64, device=self._device)

    def reset(self, device: torch.device | None = None) -> None:
        """Forget every sum; an empty state is allocated on ``device`` (default: the CPU)."""
        self._sums = None
        self._device = device

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class MeanOf(Metric):
    """The sample-weighted mean of a function ``fn(outputs, targets)`` over an evaluation.

    A scalar result is the batch's mean, weighted by its number of samples (dimension 0 of
    the targets); a 1-D result of one value per sample is summed and counted per sample.
    A Python number is accepted too (it costs a copy to the device: return a tensor).

    >>> mean = MeanOf(lambda outputs, targets: (outputs - targets).abs())
    >>> mean.update(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0]))
    >>> mean.compute(mean.state())
    1.0
    """

    def __init__(self, fn: MetricFn) -> None:
        super().__init__(size=2)  # [sum of the values, number of samples]
        self.fn = fn

    @override
    def update(self, outputs: Any, targets: Any) -> None:
        samples = count_samples((outputs, targets))
        value = self.fn(outputs, targets)
        if is_number(value):
            self.add(torch.tensor([float(value) * samples, samples], dtype=torch.float64))
            return
        if isinstance(value, torch.Tensor) and value.ndim == 0:
            total = value.detach().double() * samples
        elif isinstance(value, torch.Tensor) and value.shape == (samples,):
            total = value.detach().sum(dtype=torch.float64)
        else:
            raise ValueError(
                f"{self!r} returned {describe(value)} for a batch of {samples} samples; "
                f"allowed: a scalar (the batch's mean) or a 1-D tensor of {samples} values "
                "(one per sample). Fix: reduce the result, e.g. return values.mean() or "
                "values.flatten(1).mean(1)."
            )
        count = torch.full((), samples, dtype=torch.float64, device=total.device)
        self.add(torch.stack([total, count]))

    @override
    def compute(self, state: torch.Tensor) -> float | None:
        total, count = state.tolist()
        return total / count if count else None

    @override
    def __repr__(self) -> str:
        return f"MeanOf({getattr(self.fn, '__name__', type(self.fn).__name__)})"

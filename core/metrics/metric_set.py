"""The named metrics of a run as one object: where a batch's predictions and targets are,
one state tensor for the single all-reduce of an evaluation, and the values by name.

Predictions and targets: ``(inputs, targets)`` batches give ``(outputs, targets)``; dict
batches (the Hugging Face convention) give ``(logits, batch["labels"])``, the logits being
``outputs["logits"]`` or ``outputs.logits``. Where a batch has no such pair, no metric
applies on that rank, and the metrics of the evaluation are None on every rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from core.errors import config_error, note_raised_in
from core.metrics.base import MeanOf, Metric, MetricFn

__all__ = ("MetricSet", "check_metrics", "logits_of")

_EXAMPLE = (
    "e.g. metrics={'accuracy': Accuracy(top_k=5), 'f1': F1Score(num_classes=3), "
    "'mae': lambda outputs, targets: (outputs - targets).abs().mean()}"
)


def logits_of(outputs: object) -> torch.Tensor | None:
    """The logits a model returned for a dict batch: ``outputs["logits"]`` of a mapping,
    ``outputs.logits`` of an object (Hugging Face's ``ModelOutput``), else None."""
    found = outputs.get("logits") if isinstance(outputs, Mapping) else None
    if found is None and not isinstance(outputs, (Mapping, torch.Tensor)):
        found = getattr(outputs, "logits", None)
    return found if isinstance(found, torch.Tensor) else None


def check_metrics(value: object) -> None:
    """Raise :class:`~core.errors.ConfigError` unless ``value`` maps identifier-like names
    to :class:`Metric` instances or callables ``(outputs, targets) -> Tensor``."""
    if not isinstance(value, Mapping):
        raise config_error(
            "metrics",
            value,
            "a mapping of names to Metric instances or callables (outputs, targets) -> Tensor",
            f"{_EXAMPLE}.",
        )
    seen: dict[int, str] = {}
    for name, metric in value.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise config_error(
                "metrics",
                name,
                "names that are str identifiers (letters, digits and _, not starting with a digit)",
                f"rename the metric; {_EXAMPLE}.",
            )
        field = f"metrics[{name!r}]"
        if isinstance(metric, type) and issubclass(metric, Metric):
            raise config_error(
                field,
                metric,
                "a Metric instance (not the class) or a callable",
                f"pass an instance: metrics={{{name!r}: {metric.__name__}(...)}}.",
            )
        if isinstance(metric, type) or not (isinstance(metric, Metric) or callable(metric)):
            raise config_error(
                field,
                metric,
                "a Metric instance or a callable (outputs, targets) -> Tensor (the batch's "
                "mean, or one value per sample)",
                f"{_EXAMPLE}.",
            )
        if id(metric) in seen:
            raise config_error(
                field,
                metric,
                f"an instance not also given as {seen[id(metric)]!r}",
                "give each name its own instance (a metric holds its sums).",
            )
        seen[id(metric)] = name


class MetricSet:
    """Named metrics updated together, with one state tensor for the ranks' all-reduce.

    Each metric's state is followed by one number: 1 on a rank where the metric did not
    apply to some batch, so that its summed state says "None" on every rank alike.

    >>> metrics = MetricSet({"accuracy": Accuracy(), "mae": lambda o, t: (o.argmax(1) - t).abs()})
    >>> batch = (torch.zeros(2, 4), torch.tensor([0, 1]))
    >>> metrics.update(torch.tensor([[0.9, 0.1], [0.8, 0.2]]), batch)
    >>> metrics.compute(metrics.state())
    {'accuracy': 0.5, 'mae': 0.5}
    """

    def __init__(self, metrics: Mapping[str, Metric | MetricFn]) -> None:
        check_metrics(metrics)
        self._metrics: dict[str, Metric] = {
            name: metric if isinstance(metric, Metric) else MeanOf(metric)
            for name, metric in metrics.items()
        }
        self._missed = dict.fromkeys(self._metrics, False)
        self._device: torch.device | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The metric names, in the order given."""
        return tuple(self._metrics)

    @property
    def size(self) -> int:
        """The length of :meth:`state`."""
        return sum(metric.size + 1 for metric in self._metrics.values())

    def reset(self, device: torch.device | None = None) -> None:
        """Start an evaluation: forget every sum; empty states live on ``device``."""
        for metric in self._metrics.values():
            metric.reset(device)
        self._device = device
        self._missed = dict.fromkeys(self._metrics, False)

    def update(self, outputs: Any, batch: Any) -> None:
        """Add one batch (the samples that count, already on the device): no host sync."""
        classes_last = isinstance(batch, Mapping)
        if classes_last:
            predictions, targets = logits_of(outputs), batch.get("labels")
        else:
            predictions, targets = outputs, batch[1]
        for name, metric in self._metrics.items():
            if predictions is None or targets is None:
                self._missed[name] = True
                continue
            metric.classes_last = classes_last
            with _named(name):
                metric.update(predictions, targets)

    def state(self) -> torch.Tensor:
        """Every metric's state and its "did not apply" flag, as one 1-D float64 tensor on
        the device; sum it over ranks and hand the sum to :meth:`compute`."""
        parts: list[torch.Tensor] = []
        for name, metric in self._metrics.items():
            with _named(name):
                state = metric.state()
            missed = state.new_full((1,), float(self._missed[name]))
            parts += [state, missed]
        if not parts:
            return torch.zeros(0, dtype=torch.float64, device=self._device)
        return torch.cat(parts)

    def compute(self, summed: torch.Tensor) -> dict[str, float | None]:
        """The values by name from the state summed over ranks (a CPU tensor: it is read
        with ``.tolist()``); None for a metric that is undefined or did not apply."""
        if summed.shape != (self.size,):
            raise ValueError(
                f"MetricSet.compute got a state of shape {tuple(summed.shape)}; allowed: "
                f"({self.size},), the shape of MetricSet.state(). Fix: pass the summed state."
            )
        values: dict[str, float | None] = {}
        offset = 0
        for name, metric in self._metrics.items():
            end = offset + metric.size
            missed = float(summed[end]) > 0
            with _named(name):
                values[name] = None if missed else metric.compute(summed[offset:end])
            offset = end + 1
        return values

    def __repr__(self) -> str:
        inner = ", ".join(f"{name!r}: {metric!r}" for name, metric in self._metrics.items())
        return f"MetricSet({{{inner}}})"


@contextlib.contextmanager
def _named(name: str) -> Iterator[None]:  # an exception escaping the metric names it
    try:
        yield
    except Exception as exc:
        note_raised_in(exc, f"metric {name!r}")
        raise

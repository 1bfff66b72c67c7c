"""Validation metrics accumulated on the device and reduced over ranks in one all-reduce.

A run's ``metrics`` maps names to :class:`Metric` instances or plain functions
``(outputs, targets) -> Tensor`` (averaged per sample by :class:`MeanOf`)::

    metrics = MetricSet({
        "accuracy": Accuracy(top_k=5),
        "f1": F1Score(num_classes=3),
        "mae": lambda outputs, targets: (outputs - targets).abs().mean(),
    })
    metrics.reset(device)
    metrics.update(outputs, batch)                                  # per batch, no host sync
    values = metrics.compute(strategy.all_reduce_sum(metrics.state()).cpu())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from core.metrics.base import MeanOf, Metric, MetricFn
    from core.metrics.classification import Accuracy, F1Score
    from core.metrics.language import Perplexity
    from core.metrics.metric_set import MetricSet, check_metrics, logits_of
    from core.metrics.regression import MeanAbsoluteError

__all__ = (
    "Accuracy",
    "F1Score",
    "MeanAbsoluteError",
    "MeanOf",
    "Metric",
    "MetricFn",
    "MetricSet",
    "Perplexity",
    "check_metrics",
    "logits_of",
)

# Each name's module loads when first asked for: importing one module of this package
# (a run imports a few) loads none of the others.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Accuracy": "core.metrics.classification",
        "F1Score": "core.metrics.classification",
        "MeanAbsoluteError": "core.metrics.regression",
        "MeanOf": "core.metrics.base",
        "Metric": "core.metrics.base",
        "MetricFn": "core.metrics.base",
        "MetricSet": "core.metrics.metric_set",
        "Perplexity": "core.metrics.language",
        "check_metrics": "core.metrics.metric_set",
        "logits_of": "core.metrics.metric_set",
    },
)

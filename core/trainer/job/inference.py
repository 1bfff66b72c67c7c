"""``evaluate()`` and ``predict()`` of a built job: its model, device, precision and ranks.

Under DDP/FSDP2 every rank calls them, each on its own shard of the loader.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from core.loop.prediction import predict
from core.trainer.assembly.arguments import check_loader
from core.trainer.epochs.validation import evaluate_parts

if TYPE_CHECKING:
    from core.trainer.assembly.build import Parts

__all__ = ("evaluate_with", "predict_with")


def evaluate_with(parts: Parts, loader: Iterable[Any] | None) -> dict[str, float | None]:
    """Loss, accuracy, ``metrics=`` values and ``samples`` (a float, over every rank, padding
    uncounted) over ``loader`` (default: the run's ``val_loader``)."""
    if loader is None:
        loader = parts.val_loader
        if loader is None:
            raise ValueError(
                "evaluate() needs a loader: this job has no val_loader. Fix: "
                "await run.evaluate(loader) with a DataLoader of (inputs, targets) batches."
            )
    else:
        check_loader(loader, "loader", max_epochs=1)
        loader = parts.distribution.prepare_loader(loader, train=False)
    epoch = parts.state.epochs_completed
    stats = evaluate_parts(parts, loader, epoch=epoch, stop=threading.Event(), step=None)
    parts.model.train()
    return {
        "loss": stats.loss,
        "accuracy": stats.accuracy,
        **stats.metrics,
        "samples": float(stats.samples),
    }


def predict_with(parts: Parts, loader: Iterable[Any]) -> list[Any]:
    """The model's outputs for every batch of this rank's shard of ``loader``, on the CPU."""
    check_loader(loader, "loader", max_epochs=1)
    sharded = parts.distribution.prepare_loader(loader, train=False)
    return predict(
        parts.model,
        sharded,
        precision=parts.policy.precision,
        strategy=parts.strategy,
        prepare_batch=parts.prepared.prepare_batch,
    )

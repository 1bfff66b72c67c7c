"""What ``await optimizer.train()`` returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ("TrainingResults",)


@dataclass(frozen=True)
class TrainingResults:
    """The outcome of one training run.

    ``train_loss`` / ``val_loss`` / ``val_accuracy`` are those of the last completed epoch;
    ``val_accuracy`` is None unless targets are class indices; ``best_val_loss`` is None
    without a ``val_loader``. ``samples_per_s`` counts training samples over training time
    (validation excluded).
    """

    epochs_completed: int
    global_step: int
    best_val_loss: float | None
    train_loss: float | None
    val_loss: float | None
    val_accuracy: float | None
    stopped_early: bool
    samples_per_s: float
    run_dir: Path

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        return data

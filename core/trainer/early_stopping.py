"""Early stopping on a monitored value: the validation loss by default, or any value the
checkpoint section's ``monitor`` may name (``val_f1``, ``val_accuracy``...), with its mode."""

from __future__ import annotations

import math
from typing import Any, Literal

from core.checkpointing.ranking import WORST, better

__all__ = ("EarlyStopping", "watched")

Mode = Literal["min", "max"]


def watched(config: Any, has_validation: bool) -> tuple[str, Mode]:
    """What early stopping watches, and which way is better: ``early_stopping.monitor``,
    else the checkpoint section's ``monitor`` (and its ``mode``); a default validation
    value without a ``val_loader`` falls back to the mean training loss."""
    stopping, checkpoint = config.early_stopping, config.checkpoint
    name = stopping.monitor or checkpoint.monitor
    mode: Mode = stopping.mode or (checkpoint.mode if name == checkpoint.monitor else "min")
    if stopping.monitor is None and not has_validation and name.startswith("val_"):
        return "train_loss", "min"
    return name, mode


class EarlyStopping:
    """Stop after ``patience`` epochs without an improvement larger than ``min_delta``.

    A non-finite value (a NaN validation loss) is never the best: it counts as a bad epoch.

    >>> stopper = EarlyStopping(patience=2)
    >>> [stopper.update(v) for v in (1.0, 0.9, 0.95, 0.91)]
    [False, False, False, True]
    >>> stopper = EarlyStopping(patience=1, mode="max", monitor="val_accuracy")
    >>> [stopper.update(v) for v in (0.5, 0.7, 0.6)]
    [False, False, True]
    """

    def __init__(
        self,
        patience: int | None,
        min_delta: float = 0.0,
        *,
        mode: Mode = "min",
        monitor: str = "val_loss",
    ) -> None:
        self.patience = patience
        self.min_delta = min_delta
        self.mode: Mode = mode
        self.monitor = monitor
        self.best = WORST[mode]
        self.bad_epochs = 0

    def update(self, value: float) -> bool:
        """Record one epoch's metric; return True when training should stop."""
        if math.isfinite(value) and better(value, self.best, self.mode, self.min_delta):
            self.best = value
            self.bad_epochs = 0
        else:
            self.bad_epochs += 1
        return self.patience is not None and self.bad_epochs >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_epochs": self.bad_epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = float(state["best"])
        self.bad_epochs = int(state["bad_epochs"])

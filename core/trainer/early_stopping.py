"""Early stopping on a metric that should go down (validation loss by default)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ("EarlyStopping",)


class EarlyStopping:
    """Stop after ``patience`` epochs without an improvement larger than ``min_delta``.

    A non-finite value (a NaN validation loss) is never the best: it counts as a bad epoch.

    >>> stopper = EarlyStopping(patience=2)
    >>> [stopper.update(v) for v in (1.0, 0.9, 0.95, 0.91)]
    [False, False, False, True]
    """

    def __init__(self, patience: int | None, min_delta: float = 0.0) -> None:
        self.patience = patience
        self.min_delta = min_delta
        self.best = math.inf
        self.bad_epochs = 0

    def update(self, value: float) -> bool:
        """Record one epoch's metric; return True when training should stop."""
        if math.isfinite(value) and value < self.best - self.min_delta:
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

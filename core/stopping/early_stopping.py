"""Early stopping on a monitored value: the validation loss by default, or any value the
checkpoint section's ``monitor`` may name (``val_f1``, ``val_accuracy``...), with its mode.
The rules (:mod:`core.stopping.rules`) are asked at every check; each stop says why in words
(``run_end``'s ``stop_reason``); ``min_epochs``/``min_steps`` hold a stop back (``due``).
"""

from __future__ import annotations

from typing import Any, Literal

from core.checkpointing.ranking import WORST
from core.stopping.config import EarlyStoppingConfig
from core.stopping.rules import stopping_rules

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
    """The stopping rules of ``config`` over one monitored value.

    >>> stopper = EarlyStopping(EarlyStoppingConfig(patience=2))
    >>> [stopper.judge(v, epochs=1, steps=1) for v in (1.0, 0.9, 0.95, 0.91)]
    [None, None, None, 'val_loss did not improve in 2 validations (best 0.9)']
    >>> EarlyStopping(EarlyStoppingConfig(patience=3)).judge(float("nan"), epochs=1, steps=1)
    'val_loss = nan is not finite (best none yet)'
    """

    def __init__(
        self, config: EarlyStoppingConfig, *, mode: Mode = "min", monitor: str = "val_loss"
    ) -> None:
        self.config = config
        self.rules = stopping_rules(config)
        self.mode: Mode = mode
        self.monitor = monitor
        self.best = WORST[mode]
        self.bad_epochs = 0
        """Checks in a row without an improvement (validations; epochs for train_loss)."""
        self.pending: str | None = None
        """A rule that fired before ``min_epochs``/``min_steps``: it stops the run then."""

    def judge(self, value: float, *, epochs: int, steps: int) -> str | None:
        """Record one check of the monitored value after ``epochs`` epochs and ``steps``
        optimizer steps; the reason to stop now, or None."""
        reason = self._rules(value)
        if reason is not None and self.pending is None:
            self.pending = reason
        return self.due(epochs=epochs, steps=steps)

    def due(self, *, epochs: int, steps: int) -> str | None:
        """The reason a rule gave, once ``min_epochs`` and ``min_steps`` are reached."""
        config, pending = self.config, self.pending
        if pending is None or not config.enabled:
            return None
        if config.min_epochs is not None and epochs < config.min_epochs:
            return None
        if config.min_steps is not None and steps < config.min_steps:
            return None
        return pending

    def _rules(self, value: float) -> str | None:
        for rule in self.rules:  # the first reason ends the check
            reason = rule.check(value, self)
            if reason is not None:
                return reason
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_epochs": self.bad_epochs, "pending": self.pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = float(state["best"])
        self.bad_epochs = int(state["bad_epochs"])
        self.pending = state.get("pending")

"""Early stopping's rules, one small class each, judged in the order of :data:`RULES`.

A rule reads the monitored value and the :class:`Watch` it shares with the others and gives
the reason to stop in words, or None to hand the value to the next rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

from core.checkpointing.ranking import better
from core.stopping.config import EarlyStoppingConfig

__all__ = (
    "DivergenceThreshold",
    "NotFinite",
    "Patience",
    "RULES",
    "StoppingRule",
    "StoppingThreshold",
    "Watch",
    "stopping_rules",
)

Mode = Literal["min", "max"]


class Watch(Protocol):
    """What the rules share: the monitored value's name and which way is better, the best
    value so far and the checks in a row without an improvement."""

    monitor: str
    mode: Mode
    best: float
    bad_epochs: int


class StoppingRule(Protocol):
    """One rule: built from the config (None: the config leaves it off), then asked at every
    check."""

    @classmethod
    def from_config(cls, config: EarlyStoppingConfig) -> StoppingRule | None: ...

    def check(self, value: float, watch: Watch) -> str | None:
        """The reason to stop at ``value``, or None to hand it to the next rule."""
        ...


def _best(watch: Watch) -> str:
    return "none yet" if math.isinf(watch.best) else f"{watch.best:.4g}"


class NotFinite:
    """Stop at once on a NaN or inf (``check_finite``); it counts as a check without an
    improvement."""

    @classmethod
    def from_config(cls, config: EarlyStoppingConfig) -> NotFinite | None:
        return cls() if config.check_finite else None

    def check(self, value: float, watch: Watch) -> str | None:
        if math.isfinite(value):
            return None
        watch.bad_epochs += 1
        return f"{watch.monitor} = {value} is not finite (best {_best(watch)})"


@dataclass(frozen=True)
class StoppingThreshold:
    """Stop at once when the value is better than ``threshold`` (strictly, as Lightning: a
    tie goes on)."""

    threshold: float

    @classmethod
    def from_config(cls, config: EarlyStoppingConfig) -> StoppingThreshold | None:
        threshold = config.stopping_threshold
        return None if threshold is None else cls(threshold)

    def check(self, value: float, watch: Watch) -> str | None:
        if not better(value, self.threshold, watch.mode):
            return None
        return f"{watch.monitor} = {value:.4g} is better than stopping_threshold {self.threshold:g}"


@dataclass(frozen=True)
class DivergenceThreshold:
    """Stop at once when the value is worse than ``threshold``."""

    threshold: float

    @classmethod
    def from_config(cls, config: EarlyStoppingConfig) -> DivergenceThreshold | None:
        threshold = config.divergence_threshold
        return None if threshold is None else cls(threshold)

    def check(self, value: float, watch: Watch) -> str | None:
        if not better(self.threshold, value, watch.mode):
            return None
        threshold = self.threshold
        return f"{watch.monitor} = {value:.4g} is worse than divergence_threshold {threshold:g}"


@dataclass(frozen=True)
class Patience:
    """Keep the best value; stop after ``patience`` checks in a row that did not improve on
    it by more than ``min_delta`` (None: never stop, the best is still kept)."""

    patience: int | None
    min_delta: float

    @classmethod
    def from_config(cls, config: EarlyStoppingConfig) -> Patience:
        return cls(config.patience, config.min_delta)

    def check(self, value: float, watch: Watch) -> str | None:
        best = _best(watch)
        if math.isfinite(value) and better(value, watch.best, watch.mode, self.min_delta):
            watch.best, watch.bad_epochs = value, 0
            return None
        watch.bad_epochs += 1  # a value that is not finite is never the best
        if self.patience is None or watch.bad_epochs < self.patience:
            return None
        check = "epoch" if watch.monitor == "train_loss" else "validation"
        checks = f"{watch.bad_epochs} {check}{'' if watch.bad_epochs == 1 else 's'}"
        by = f" by more than {self.min_delta:g}" if self.min_delta else ""
        return f"{watch.monitor} did not improve{by} in {checks} (best {best})"


RULES: tuple[type[StoppingRule], ...] = (
    NotFinite,
    StoppingThreshold,
    DivergenceThreshold,
    Patience,
)
"""The rules in the order they are asked: Lightning's ``EarlyStopping``'s order."""


def stopping_rules(config: EarlyStoppingConfig) -> list[StoppingRule]:
    """The rules ``config`` turns on, in the order of :data:`RULES`."""
    return [rule for kind in RULES if (rule := kind.from_config(config)) is not None]

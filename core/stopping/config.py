"""Early stopping's section of the config tree (``TrainingConfig.early_stopping``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from core.checkpointing.config import METRIC_NAME
from core.checks import check_bool_fields, is_finite_number, is_int
from core.errors import config_error
from core.flat_keyword import flat

__all__ = ("EarlyStoppingConfig",)


@dataclass(frozen=True, kw_only=True)
class EarlyStoppingConfig:
    """When the run stops before ``max_epochs``, judged at every validation (without a
    ``val_loader``: at every epoch end, on the training loss), as Lightning's
    ``EarlyStopping`` judges:

    - ``patience``: stop after ``patience`` validations in a row whose ``monitor`` did not
      improve by more than ``min_delta`` (lower with ``mode="min"``, higher with ``"max"``);
      None: no patience rule;
    - ``check_finite`` (on): stop at once when the monitored value is NaN or inf;
    - ``stopping_threshold``: stop at once when the value is better than this (a tie goes on);
    - ``divergence_threshold``: stop at once when the value is worse than this;
    - ``min_epochs`` / ``min_steps``: no rule stops the run before this many epochs /
      optimizer steps (a rule that fired earlier stops it at the first validation after).

    Early stopping is on when ``patience`` or a threshold is set (``check_finite`` alone
    stops nothing). ``monitor=None`` watches what the checkpoint section's ``monitor`` names,
    with its ``mode`` (by default the validation loss, or the mean training loss without a
    ``val_loader``): one setting for the best checkpoint and for stopping. Why the run
    stopped is ``run_end``'s ``stop_reason`` (and ``TrainingResults.stop_reason``)."""

    patience: int | None = field(default=None, metadata=flat("early_stopping_patience"))
    min_delta: float = field(default=0.0, metadata=flat("early_stopping_min_delta"))
    monitor: str | None = field(default=None, metadata=flat("early_stopping_monitor"))
    mode: Literal["min", "max"] | None = field(default=None, metadata=flat("early_stopping_mode"))
    check_finite: bool = field(default=True, metadata=flat("check_finite"))
    stopping_threshold: float | None = field(default=None, metadata=flat("stopping_threshold"))
    divergence_threshold: float | None = field(default=None, metadata=flat("divergence_threshold"))
    min_epochs: int | None = field(default=None, metadata=flat("min_epochs"))
    min_steps: int | None = field(default=None, metadata=flat("min_steps"))

    def __post_init__(self) -> None:
        if self.monitor is not None and not (
            isinstance(self.monitor, str) and METRIC_NAME.match(self.monitor)
        ):
            raise config_error(
                "early_stopping.monitor",
                self.monitor,
                "None (the checkpoint section's monitor), 'val_loss', 'train_loss', "
                "'val_accuracy' or 'val_<name>' of a metric",
                "e.g. monitor='val_f1'.",
            )
        if self.mode not in (None, "min", "max"):
            raise config_error(
                "early_stopping.mode", self.mode, "None (the checkpoint's mode), 'min' or 'max'"
            )
        if self.patience is not None and not (is_int(self.patience) and self.patience >= 1):
            raise config_error(
                "patience",
                self.patience,
                "None (off) or an integer >= 1",
                "pass None to train for max_epochs.",
            )
        if not (is_finite_number(self.min_delta) and self.min_delta >= 0):
            raise config_error("min_delta", self.min_delta, "a finite float >= 0")
        check_bool_fields(self)
        for name in ("stopping_threshold", "divergence_threshold"):
            value = getattr(self, name)
            if value is not None and not is_finite_number(value):
                raise config_error(name, value, "None (off) or a finite number")
        for name in ("min_epochs", "min_steps"):
            value = getattr(self, name)
            if value is not None and not (is_int(value) and value >= 0):
                raise config_error(name, value, "None or an integer >= 0")

    @property
    def enabled(self) -> bool:
        """Whether any rule may stop the run: a ``patience`` or a threshold is set."""
        return self.patience is not None or not (
            self.stopping_threshold is None and self.divergence_threshold is None
        )

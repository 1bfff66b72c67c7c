"""The orchestrator's own settings, validated before anything runs, and the small checks
every component config shares (``is_int``, ``is_number``, ``check_bool_fields``...)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.checks import check_bool_fields, is_finite_number, is_int, is_number, is_path
from core.errors import config_error

if TYPE_CHECKING:
    pass

__all__ = ("TrainingConfig",)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class TrainingConfig:
    """Epochs, optimizer defaults, early stopping, logging and seeding of one job.

    Early stopping watches the validation loss, or the epoch's mean training loss when
    there is no ``val_loader``; ``early_stopping_patience=None`` turns it off. Records are
    written to the JSONL log and to ``events()`` every ``log_flush_interval_s`` seconds, at
    every epoch end and at the end of the run. ``handle_signals=True`` turns SIGTERM/SIGINT
    into a graceful stop (see ``core.trainer.signals``); scripts that own their process want it.

    A stop (cancellation, a signal) waits at most ``stop_grace_s`` for the step thread to
    reach a step boundary; past that the run is abandoned (``run_end`` status
    ``abandoned``, naming the last good checkpoint) and ``train()`` returns control. A
    loader that has not delivered a batch for ``data_stall_warn_s`` gets a ``data_stall``
    warning record, repeated with backoff.
    """

    experiment_name: str = "experiment"
    max_epochs: int = 10
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    early_stopping_patience: int | None = None
    early_stopping_min_delta: float = 0.0
    max_grad_norm: float | None = None
    log_dir: str | Path = "logs"
    seed: int | None = None
    event_buffer_size: int = 1024
    log_flush_interval_s: float = 0.25
    handle_signals: bool = False
    monitor_interval_s: float = 1.0
    stop_grace_s: float = 30.0
    data_stall_warn_s: float = 60.0

    def __post_init__(self) -> None:
        if not (isinstance(self.experiment_name, str) and _SAFE_NAME.match(self.experiment_name)):
            raise config_error(
                "experiment_name",
                self.experiment_name,
                "a non-empty name of letters, digits, '.', '_' or '-' (it becomes a folder)",
            )
        if not (is_int(self.max_epochs) and self.max_epochs >= 1):
            raise config_error("max_epochs", self.max_epochs, "an integer >= 1")
        if not (is_finite_number(self.learning_rate) and self.learning_rate > 0):
            raise config_error(
                "learning_rate", self.learning_rate, "a finite float > 0", "try learning_rate=1e-3."
            )
        if not (is_finite_number(self.weight_decay) and self.weight_decay >= 0):
            raise config_error("weight_decay", self.weight_decay, "a finite float >= 0")
        patience = self.early_stopping_patience
        if patience is not None and not (is_int(patience) and patience >= 1):
            raise config_error(
                "early_stopping_patience",
                patience,
                "None (off) or an integer >= 1",
                "pass None to train for max_epochs.",
            )
        if not (
            is_finite_number(self.early_stopping_min_delta) and self.early_stopping_min_delta >= 0
        ):
            raise config_error(
                "early_stopping_min_delta", self.early_stopping_min_delta, "a finite float >= 0"
            )
        norm = self.max_grad_norm
        if norm is not None and not (is_finite_number(norm) and norm > 0):
            raise config_error(
                "max_grad_norm", norm, "None (no clipping) or a finite float > 0", "try 1.0."
            )
        if self.seed is not None and not (is_int(self.seed) and self.seed >= 0):
            raise config_error("seed", self.seed, "None or an integer >= 0")
        if not (is_int(self.event_buffer_size) and self.event_buffer_size >= 1):
            raise config_error("event_buffer_size", self.event_buffer_size, "an integer >= 1")
        if not (is_finite_number(self.monitor_interval_s) and self.monitor_interval_s > 0):
            raise config_error(
                "monitor_interval_s", self.monitor_interval_s, "a finite number of seconds > 0"
            )
        if not is_path(self.log_dir):
            raise config_error(
                "log_dir", self.log_dir, "a non-empty str or pathlib.Path", "e.g. log_dir='logs'."
            )
        check_bool_fields(self)
        interval = self.log_flush_interval_s
        if not (is_number(interval) and 0 < interval <= 60):
            raise config_error("log_flush_interval_s", interval, "a number of seconds in (0, 60]")

        for name in ("stop_grace_s", "data_stall_warn_s"):
            seconds = getattr(self, name)
            if not (is_finite_number(seconds) and seconds > 0):
                raise config_error(name, seconds, "a finite number of seconds > 0")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["log_dir"] = str(self.log_dir)
        return data

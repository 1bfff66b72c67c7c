"""The checkpoint section of the config tree: where, when, what to keep, resuming."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from core.checks import check_bool_fields, is_int, is_path
from core.errors import config_error

__all__ = ("CheckpointConfig",)

_METRIC_NAME = re.compile(r"^(val|train)_[A-Za-z_][A-Za-z0-9_]*$")


def _optional_positive(value: object) -> bool:
    return value is None or (is_int(value) and value >= 1)


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where and when checkpoints are written, and whether a run resumes from one.

    ``checkpoint_dir=None`` means ``<log_dir>/<experiment_name>/checkpoints``, shared by the
    experiment's runs so that ``resume="auto"`` (the newest valid checkpoint) finds them.
    ``resume`` may also be a checkpoint directory, or None to start fresh.

    ``save_best=True`` also keeps the checkpoint where ``monitor`` (``val_loss``,
    ``train_loss``, ``val_accuracy`` or ``val_<metric>``) was best (lowest with
    ``mode="min"``, highest with ``"max"``), apart from the ``keep_last_n`` newest.
    """

    checkpoint_dir: str | Path | None = None
    checkpoint_every_n_steps: int | None = None
    checkpoint_every_n_epochs: int | None = 1
    keep_last_n: int = 2
    resume: str | Path | None = None
    save_on_cancel: bool = True
    safe_globals: Sequence[Any] = ()
    save_best: bool = False
    monitor: str = "val_loss"
    mode: Literal["min", "max"] = "min"

    def __post_init__(self) -> None:
        if not (isinstance(self.monitor, str) and _METRIC_NAME.match(self.monitor)):
            raise config_error(
                "monitor", self.monitor,
                "'val_loss', 'train_loss', 'val_accuracy' or 'val_<name>' of a metric",
                "e.g. monitor='val_f1' for metrics={'f1': F1Score(num_classes=2)}.",
            )  # fmt: skip
        if self.mode not in ("min", "max"):
            raise config_error(
                "mode", self.mode, "'min' or 'max'", "mode='max' for accuracy-like metrics."
            )
        for name in ("checkpoint_every_n_steps", "checkpoint_every_n_epochs"):
            if not _optional_positive(getattr(self, name)):
                raise config_error(name, getattr(self, name), "None (never) or an integer >= 1")
        if not (is_int(self.keep_last_n) and self.keep_last_n >= 1):
            raise config_error("keep_last_n", self.keep_last_n, "an integer >= 1")
        check_bool_fields(self)
        if self.checkpoint_dir is not None and not is_path(self.checkpoint_dir):
            raise config_error(
                "checkpoint_dir", self.checkpoint_dir, "None (next to the logs) or a directory path"
            )
        self._check_resume()

    def _check_resume(self) -> None:
        resume, allowed = self.resume, "None, 'auto' or the path of a checkpoint directory"
        if resume is None or resume == "auto":
            return
        if not is_path(resume):
            raise config_error("resume", resume, allowed)
        if str(resume).lower() == "auto":
            raise config_error("resume", resume, allowed, "write resume='auto' in lower case.")
        if not Path(resume).is_dir():
            raise config_error(
                "resume", resume, allowed, "no such directory; pass an existing checkpoint "
                "(a step-... directory) or resume='auto' for the newest one.",
            )  # fmt: skip

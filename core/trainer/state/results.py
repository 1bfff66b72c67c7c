"""What ``await run.train()`` returns, the running tally it is built from, and how a run is
ending while it closes."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ("RunEnding", "RunProgress", "TrainingResults")


@dataclass(frozen=True)
class TrainingResults:
    """The outcome of one training run.

    ``train_loss`` / ``val_loss`` / ``val_accuracy`` are the last completed epoch's, averaged
    over all ranks (``val_accuracy``: None unless targets are class indices); ``best_val_loss``
    is None without a ``val_loader``; ``val_metrics`` are the last validation's ``metrics=``.
    ``samples_per_s`` counts this rank's training samples over training time (validation
    excluded). ``interrupted``: another rank stopped the job. ``stop_reason``: why a rule or a
    callback ended the run early (``"early_stopping: ..."``, ``"requested: <reason>"``), else
    None. With ``save_best``, ``best_value`` is the best ``monitor`` value and
    ``best_checkpoint`` its checkpoint (:func:`core.load_weights`); ``last_checkpoint`` is the
    newest. ``run_dir`` is None for a ``fast_dev_run``, whose files were removed with it.
    """

    epochs_completed: int
    global_step: int
    best_val_loss: float | None
    train_loss: float | None
    val_loss: float | None
    val_accuracy: float | None
    stopped_early: bool
    samples_per_s: float
    run_dir: Path | None
    interrupted: bool = False
    val_metrics: dict[str, float | None] = field(default_factory=dict)
    monitor: str | None = None
    best_value: float | None = None
    best_checkpoint: str | None = None
    last_checkpoint: str | None = None
    stop_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["run_dir"] = None if self.run_dir is None else str(self.run_dir)
        return data


@dataclass
class RunProgress:
    """Tally kept by the orchestrator while epochs complete."""

    train_loss: float | None = None
    val_loss: float | None = None
    val_accuracy: float | None = None
    best_val_loss: float | None = None
    stopped_early: bool = False
    interrupted: bool = False
    samples: int = 0
    train_time_s: float = 0.0
    val_metrics: dict[str, float | None] = field(default_factory=dict)
    best_value: float | None = None
    best_checkpoint: str | None = None
    top_k: list[list[float | str]] = field(default_factory=list)  # [value, path], best first
    stop_reason: str | None = None

    def add_epoch(self, samples: int, time_s: float) -> None:
        self.samples += samples
        self.train_time_s += time_s

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.train_time_s if self.train_time_s else 0.0

    def add_validation(
        self,
        loss: float | None,
        accuracy: float | None,
        metrics: dict[str, float | None] | None = None,
    ) -> None:
        """``loss`` None: a ``validation_step`` that returns metrics only."""
        self.val_loss, self.val_accuracy = loss, accuracy
        self.val_metrics = dict(metrics or {})
        if loss is not None and math.isfinite(loss):  # NaN or inf is never the best
            best = self.best_val_loss
            self.best_val_loss = loss if best is None else min(best, loss)

    def results(
        self,
        *,
        epochs_completed: int,
        global_step: int,
        run_dir: Path | None,
        monitor: str | None = None,
        last_checkpoint: str | None = None,
    ) -> TrainingResults:
        names = [f.name for f in fields(TrainingResults) if hasattr(self, f.name)]
        tally = {name: getattr(self, name) for name in names}  # the results' fields kept here
        return TrainingResults(
            **tally | {"val_metrics": dict(self.val_metrics)},
            epochs_completed=epochs_completed,
            global_step=global_step,
            run_dir=run_dir,
            monitor=monitor,
            last_checkpoint=last_checkpoint,
        )


@dataclass
class RunEnding:
    """How a run is ending: its ``run_end`` status, the error, the stop signals received."""

    status: str = "failed"
    error: Exception | None = None
    signals: list[int] = field(default_factory=list)

"""Validation during a run: when it is due, running it, its record, and the best checkpoint.

Validation runs on the step thread after every ``val_every_n_epochs``-th epoch and, as a step
hook, every ``val_every_n_steps`` optimizer steps (never twice at one step), over the first
``limit_val_batches`` batches of the ``val_loader`` (all without a limit). After each
one, with ``save_best=True``, the monitored value (``val_loss``, ``val_accuracy``,
``val_<metric>``; ``train_loss`` at epoch ends) is compared with the best so far and an
improvement is saved as a checkpoint the store keeps apart from ``keep_last_n``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from core.config import TrainingConfig
from core.distributed.lockstep import batches_in
from core.loop.evaluation import EvalStats, evaluate
from core.loop.limit import limit_batches

if TYPE_CHECKING:
    from core.telemetry.run_log import CurrentLog
    from core.trainer.build import Parts

__all__ = ("Validation",)

Save = Callable[..., "str | None"]


class Validation:
    """The validation schedule and the best checkpoint of one job."""

    def __init__(self, config: TrainingConfig, parts: Parts, log: CurrentLog, save: Save) -> None:
        self.run = config.run
        self.checkpoint = config.checkpoint
        self.parts = parts
        self.log = log
        self.save = save
        self.last_step: int | None = None
        """The optimizer step of the latest validation (None: none yet in this process)."""
        self.since_epoch_end: EvalStats | None = None
        """The latest validation since the last epoch end (what early stopping watches)."""
        given = parts.val_loader
        self.loader = (  # a bad limit for this loader fails here, when the job is built
            None if given is None
            else limit_batches(given, self.run.limit_val_batches, "limit_val_batches")
        )  # fmt: skip
        """What a validation evaluates: the val_loader, limited to ``limit_val_batches``."""

    # -- when -----------------------------------------------------------------------------
    def due_after_epoch(self, epochs_completed: int) -> bool:
        every = self.run.val_every_n_epochs
        return (
            self.parts.val_loader is not None
            and every is not None
            and epochs_completed % every == 0
            and self.last_step != self.parts.loop.global_step
        )

    def due_after_step(self, step: int) -> bool:
        every = self.run.val_every_n_steps
        return self.parts.val_loader is not None and every is not None and step % every == 0

    # -- running --------------------------------------------------------------------------
    def validate(self, epoch: int, stop: threading.Event) -> EvalStats:
        """One validation pass, its ``validation_start``/``validation`` records, the tally."""
        parts, log, loader = self.parts, self.log, self.loader
        assert loader is not None
        step = parts.loop.global_step
        log.emit("validation_start", epoch=epoch, step=step, batches=batches_in(loader))
        evaluation = evaluate(
            parts.model, loader, epoch=epoch, stop=stop, precision=parts.precision.precision,
            strategy=parts.strategy, objective=parts.objective, errors=parts.errors,
            prepare_batch=parts.prepared.prepare_batch, metrics=parts.metrics,
        )  # fmt: skip
        if evaluation.interrupted:
            return evaluation
        if not math.isfinite(evaluation.loss):
            log.error(
                "error", kind="nonfinite_validation_loss", epoch=epoch, step=step,
                val_loss=evaluation.loss,
                effect="not counted as an improvement by early stopping or best_val_loss",
            )  # fmt: skip
        parts.state.progress.add_validation(
            evaluation.loss, evaluation.accuracy, dict(evaluation.metrics)
        )
        log.emit(
            "validation", epoch=epoch, step=step, val_loss=evaluation.loss,
            val_accuracy=evaluation.accuracy, metrics=dict(evaluation.metrics),
            samples=evaluation.samples,
        )  # fmt: skip
        self.last_step = step
        self.since_epoch_end = evaluation
        return evaluation

    def validate_if_due(self, step: int, stop: threading.Event) -> None:
        """After an optimizer step (a step hook): validate on ``val_every_n_steps``."""
        if not self.due_after_step(step):
            return
        parts = self.parts
        parts.loop.flush()  # step records before the validation's
        evaluation = self.validate(parts.loop.epoch, stop)
        parts.model.train()
        if not evaluation.interrupted:
            self.keep_if_best(self.values(evaluation))

    # -- the best checkpoint --------------------------------------------------------------
    @staticmethod
    def values(evaluation: EvalStats | None, train_loss: float | None = None) -> dict[str, Any]:
        """What ``monitor`` may name, from a validation and the epoch's training loss."""
        values: dict[str, Any] = {"train_loss": train_loss}
        if evaluation is not None:
            values |= {"val_loss": evaluation.loss, "val_accuracy": evaluation.accuracy}
            values |= {f"val_{name}": value for name, value in evaluation.metrics.items()}
        return values

    def keep_if_best(self, values: dict[str, Any]) -> None:
        """With ``save_best``: checkpoint an improvement of the monitored value and keep it."""
        config, progress = self.checkpoint, self.parts.state.progress
        value = values.get(config.monitor)
        if not config.save_best or value is None or not math.isfinite(value):
            return
        best = progress.best_value
        if best is not None and not (value < best if config.mode == "min" else value > best):
            return
        path = self.save("best", best=True)
        progress.best_value = float(value)
        if path is not None:
            progress.best_checkpoint = path
            self.parts.checkpointer.keep_best(path)

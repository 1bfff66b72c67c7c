"""Validation during a run: when it is due, running it, its record, and the best checkpoint.

The best checkpoints (``save_best``/``save_top_k``) are kept apart from ``keep_last_n``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.checkpointing.manifest import is_checkpoint
from core.checkpointing.ranking import Ranked, offer
from core.config import TrainingConfig
from core.distributed.lockstep import batches_in
from core.loop.evaluation import EvalStats, evaluate
from core.loop.limit import limit_batches

if TYPE_CHECKING:
    from core.telemetry.run_log import CurrentLog
    from core.trainer.assembly.build import Parts
    from core.trainer.epochs.judging import Judge

__all__ = ("Validation", "evaluate_parts")

Save = Callable[..., "str | None"]


def evaluate_parts(
    parts: Parts, loader: Iterable[Any], *, epoch: int, stop: threading.Event, step: int | None
) -> EvalStats:
    """:func:`~core.loop.evaluation.evaluate` with the run's model and parts."""
    return evaluate(
        parts.model,
        loader,
        epoch=epoch,
        stop=stop,
        precision=parts.policy.precision,
        strategy=parts.strategy,
        objective=parts.objective.evaluation(),
        errors=parts.errors,
        prepare_batch=parts.prepared.prepare_batch,
        metrics=parts.metrics,
        step=step,
    )


class Validation:
    """The validation schedule and the best checkpoint of one job."""

    def __init__(
        self, config: TrainingConfig, parts: Parts, log: CurrentLog, save: Save, judge: Judge
    ) -> None:
        self.run = config.run
        self.judge = judge
        self.checkpoint = config.checkpoint
        self.parts = parts
        self.log = log
        self.save = save
        self.last_step: int | None = None  # the step of the latest validation in this process
        self.since_epoch_end: EvalStats | None = None  # what early stopping watches
        self.loader: Iterable[Any] | None = None  # the val_loader, limited
        if parts.val_loader is not None:  # a bad limit fails here, when the job is built
            limit = self.run.limit_val_batches
            self.loader = limit_batches(parts.val_loader, limit, "limit_val_batches")

    # -- when -----------------------------------------------------------------------------
    def due_after_epoch(self, epochs_completed: int) -> bool:
        every = self.run.val_every_n_epochs
        return (
            self.parts.val_loader is not None
            and every is not None
            and epochs_completed % every == 0
            and self.last_step != self.parts.loop.global_step
        )

    @property
    def every_n_steps(self) -> int | None:
        return None if self.parts.val_loader is None else self.run.val_every_n_steps

    def due_after_step(self, step: int) -> bool:
        every = self.every_n_steps
        return every is not None and step % every == 0

    # -- running --------------------------------------------------------------------------
    def validate(self, epoch: int, stop: threading.Event) -> EvalStats:
        """One validation pass, its records and the tally."""
        parts, log, loader = self.parts, self.log, self.loader
        assert loader is not None
        step = parts.loop.global_step
        log.emit("validation_start", epoch=epoch, step=step, batches=batches_in(loader))
        evaluation = evaluate_parts(parts, loader, epoch=epoch, stop=stop, step=step)
        if evaluation.interrupted:
            return evaluation
        if not math.isfinite(evaluation.loss):
            log.error(
                "error",
                kind="nonfinite_validation_loss",
                epoch=epoch,
                step=step,
                val_loss=evaluation.loss,
                effect="not counted as an improvement by early stopping or best_val_loss",
            )
        parts.state.progress.add_validation(
            evaluation.loss, evaluation.accuracy, dict(evaluation.metrics)
        )
        log.emit(
            "validation",
            epoch=epoch,
            step=step,
            val_loss=evaluation.loss,
            val_accuracy=evaluation.accuracy,
            metrics=dict(evaluation.metrics),
            samples=evaluation.samples,
        )
        self.last_step = step
        self.since_epoch_end = evaluation
        return evaluation

    def validate_if_due(self, step: int, stop: threading.Event) -> None:
        """After an optimizer step: validate on ``val_every_n_steps``."""
        if not self.due_after_step(step):
            return
        parts = self.parts
        parts.loop.flush()  # step records before the validation's
        evaluation = self.validate(parts.loop.epoch, stop)
        parts.model.train()
        if not evaluation.interrupted:
            values = self.values(evaluation)
            self.keep_if_best(values)
            if not self.judge.at_epoch_end:  # a stop here ends the epoch at this step
                self.judge.check(values, epochs=parts.state.epochs_completed, stop=stop)

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
        """Checkpoint and keep a monitored value that enters the top ``k``."""
        config, progress = self.checkpoint, self.parts.state.progress
        value = values.get(config.monitor)
        if not config.tracks_best or value is None or not math.isfinite(value):
            return
        checkpointer = self.parts.checkpointer
        path = str(checkpointer.store.final_path(self.parts.loop.global_step))
        ranked = offer(progress.top_k, float(value), path, k=config.top_k, mode=config.mode)
        if ranked is None:
            return
        before = (progress.top_k, progress.best_value, progress.best_checkpoint)
        is_best = ranked[0][1] == path
        self._tally(ranked)  # before the write: the checkpoint holds itself as the best
        checkpointer.mark_stale()  # the tally changed: this step's checkpoint is written now
        try:
            saved = self.save("best" if is_best else "top_k", best=is_best)
        except BaseException:
            progress.top_k, progress.best_value, progress.best_checkpoint = before
            raise
        if saved is None:  # nothing is written (a smoke run): the value, and no checkpoint
            progress.top_k = before[0]
            if is_best:
                progress.best_value, progress.best_checkpoint = float(value), None
            return
        checkpointer.keep_best([str(p) for _, p in ranked])

    def _tally(self, ranked: Ranked) -> None:
        progress = self.parts.state.progress
        progress.top_k = ranked
        progress.best_value = float(ranked[0][0]) if ranked else None
        progress.best_checkpoint = str(ranked[0][1]) if ranked else None

    def forget_missing(self) -> None:
        """After a resume: drop the kept best checkpoints that no longer exist."""
        progress = self.parts.state.progress
        ranked = progress.top_k
        if not ranked and progress.best_checkpoint and progress.best_value is not None:
            ranked = [[progress.best_value, progress.best_checkpoint]]  # older checkpoints
        present = [entry for entry in ranked if is_checkpoint(Path(str(entry[1])))]
        if present == ranked and ranked == progress.top_k:
            return
        for _, path in (entry for entry in ranked if entry not in present):
            self.log.warning(
                "error",
                kind="best_checkpoint_missing",
                path=str(path),
                effect="no longer a best checkpoint of this run: it was deleted or pruned",
            )
        self._tally(present)

"""Validation during a run: when it is due, running it, its record, and the best checkpoint;
the sanity check before the first training step (Lightning's ``num_sanity_val_steps``).

The best checkpoints (``save_best``/``save_top_k``) are kept apart from ``keep_last_n``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.checkpointing.manifest import is_checkpoint
from core.checkpointing.ranking import Ranked, offer
from core.config import TrainingConfig
from core.distributed.lockstep import batches_in
from core.errors import LossFormatError
from core.loop.evaluation import EvalStats, evaluate
from core.loop.limit import limit_batches
from core.rng import capture_rng, restore_rng

if TYPE_CHECKING:
    from core.telemetry.run_log import CurrentLog
    from core.trainer.assembly.build import Parts
    from core.trainer.epochs.judging import Judge

__all__ = ("Validation", "evaluate_parts")

Save = Callable[..., "str | None"]


def evaluate_parts(
    parts: Parts,
    loader: Iterable[Any],
    *,
    epoch: int,
    stop: threading.Event,
    step: int | None,
    clear_cache_every: int | None = None,
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
        clear_cache_every=clear_cache_every,
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
        every = self.run.clear_cache_every_n_val_batches
        evaluation = evaluate_parts(
            parts, loader, epoch=epoch, stop=stop, step=step, clear_cache_every=every
        )
        if evaluation.interrupted:
            return evaluation
        self._check_loss_is_optional(evaluation, f"the validation at epoch {epoch}, step {step}")
        if evaluation.loss is not None and not math.isfinite(evaluation.loss):
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
            cache_clears=evaluation.cache_clears,
        )
        self.last_step = step
        self.since_epoch_end = evaluation
        return evaluation

    def sanity_check(self, stop: threading.Event) -> None:
        """Validate on the first ``num_sanity_val_steps`` batches before training, so a
        broken validation fails at step 0; it changes nothing the run keeps (no tally, no
        best checkpoint, no early-stopping check, every RNG stream restored: the val loader's
        iterator draws a seed from torch's) and writes one ``sanity_check`` record."""
        batches = self.run.num_sanity_val_steps
        validates = self.run.val_every_n_epochs or self.run.val_every_n_steps
        if self.loader is None or not batches or not validates:
            return
        parts = self.parts
        epoch, step = parts.state.epochs_completed, parts.loop.global_step
        loader = limit_batches(self.loader, batches, "num_sanity_val_steps")
        rng = capture_rng()
        started = time.perf_counter()
        try:
            evaluation = evaluate_parts(parts, loader, epoch=epoch, stop=stop, step=step)
        finally:
            restore_rng(rng)
            parts.model.train()
        if evaluation.interrupted:
            return
        self.log.emit(
            "sanity_check",
            epoch=epoch,
            step=step,
            batches=batches_in(loader),
            samples=evaluation.samples,
            val_loss=evaluation.loss,
            time_s=time.perf_counter() - started,
        )
        where = f"the sanity check before training (epoch {epoch}, step {step})"
        self._check_loss_is_optional(evaluation, where)

    def _check_loss_is_optional(self, evaluation: EvalStats, where: str) -> None:
        """A validation without a loss (a ``validation_step`` returning metrics only) fails
        where ``val_loss`` is watched, naming the watcher and the values it could watch."""
        if evaluation.loss is not None:
            return
        watchers = []
        if self.checkpoint.tracks_best:
            watchers.append(("monitor", self.checkpoint.monitor))
        if self.parts.early_stopping.config.enabled or self.parts.plateau is not None:
            watchers.append(("early_stopping.monitor", self.judge.monitor))
        for name, watched in watchers:
            if watched != "val_loss":
                continue
            values = self.values(evaluation, 0.0)  # train_loss: any number, to be named
            produced = [key for key, value in values.items() if value is not None]
            raise LossFormatError(
                f"{name}='val_loss' needs a validation loss, but validation_step returned "
                f"none in {where} (dicts without 'loss'); allowed: a monitor of the values "
                f"this run records: {', '.join(map(repr, produced))}. Fix: return "
                f"{{'loss': loss, ...}} from validation_step, or set {name} to one of them "
                "(with mode='max' for an accuracy)."
            )

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

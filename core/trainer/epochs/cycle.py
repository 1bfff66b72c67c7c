"""The synchronous work of a run around its epochs, all run on the step thread: opening
and closing the run's files, what happens at an epoch's end (validation, the means over
ranks, early stopping, records, the epoch checkpoint) and saving. Collectives, file writes
and device syncs happen here, never on the event loop's thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch

from core.checks import check_writable_dir
from core.config import TrainingConfig
from core.loop.epoch import EpochStats, ResumePoint
from core.loop.schedule import next_multiple
from core.monitoring.bottleneck import epoch_verdict
from core.reports.apart import start_reports
from core.rng import seed_everything
from core.telemetry.describe import run_end_fields, run_start_fields
from core.telemetry.events import EventHub
from core.telemetry.run_log import CurrentLog, RunLog, new_run_id
from core.trainer.assembly.build import Parts
from core.trainer.epochs.judging import Judge
from core.trainer.epochs.plan import lineage, plan
from core.trainer.epochs.validation import Validation
from core.trainer.state.results import RunEnding

__all__ = ("EpochEnd", "RunCycle")

_process_log = structlog.get_logger("core")


@dataclass(frozen=True)
class EpochEnd:
    """How an epoch ended, as the async shell needs to know it."""

    interrupted: bool = False  # a stop arrived during validation (all ranks agreed)
    stop: bool = False  # early stopping says this was the last epoch


class RunCycle:
    """One run's files and epoch edges, for the parts of one job."""

    def __init__(
        self, config: TrainingConfig, parts: Parts, hub: EventHub, current: CurrentLog
    ) -> None:
        self.config = config
        self.parts = parts
        self.hub = hub
        self.current = current  # where the parts write records: each run's log once open
        self.judge = Judge(parts)
        self.validation = Validation(config, parts, current, self.save, self.judge)
        self.stop = threading.Event()  # the run in progress's stop flag
        self.requested: str | None = None  # why a callback asked it to stop
        self._opened_at = 0.0

    def new_stop(self) -> threading.Event:
        """A fresh stop flag for the next run (its step thread sets it)."""
        self.stop, self.requested = threading.Event(), None
        return self.stop

    def request_stop(self, reason: str) -> None:
        """Stop the run in progress at its next step boundary (any thread)."""
        if self.requested is None:
            self.requested = reason
        self.stop.set()

    @property
    def log(self) -> RunLog | None:
        return self.current.log

    # -- the run's files ------------------------------------------------------------------
    def open(self, description: dict[str, Any]) -> RunLog:
        """Agree on a run id, create the run's directory and queue ``run_start`` (the run
        drains it once the directory is announced: no callback sees a run without one)."""
        run, parts = self.config.run, self.parts
        run_id = parts.strategy.broadcast_object(new_run_id())
        try:
            log = RunLog.create(
                Path(run.log_dir),
                run.experiment_name,
                run_id,
                rank=parts.strategy.rank,
                hub=self.hub,
                temporary=not run.keeps_files,
            )
        except OSError:
            if run.keeps_files:  # made unwritable since the job was created: say it as then
                check_writable_dir("log_dir", run.log_dir)
            raise
        self.current.log = log
        self._opened_at = time.monotonic()
        self.validation.last_step = None
        parts.checkpointer.begin_run(run_id)
        if run.seed is not None:
            seed_everything(run.seed, deterministic=run.deterministic)
        log.write_json("config.json", {**self.config.to_dict(), "resolved": description})
        log.emit(
            "run_start",
            **run_start_fields(
                self.config.to_dict(),
                description,
                device=str(parts.strategy.device),
                precision=parts.policy.precision.name,
                run_dir=str(log.run_dir),
            ),
            model_summary=parts.model_summary,
            plan=plan(self.config, parts),
            loaders=parts.loaders,
            seed=run.seed,
            **lineage(parts, log.run_dir, run_id),
        )
        if parts.policy.compatibility is not None:
            log.emit("amp_compatibility", **parts.policy.compatibility)
        if parts.profiler is not None:
            parts.profiler.start(log.run_dir)
        return log

    def close(self, end: RunEnding, *, abandoned: bool) -> None:
        """Write ``run_end``, then close the log and the event hub and let go of the lineage
        whatever fails (an ``events()`` stream always ends; the next run may continue)."""
        log, parts = self.log, self.parts
        try:
            if log is None:
                return
            error = end.error
            if not abandoned:  # an abandoned thread still owns the loop's state
                try:
                    parts.loop.flush()
                except Exception as exc:  # the run already failed; keep the first error
                    error = error or exc
            if parts.profiler is not None and not abandoned:
                parts.profiler.close()
            log.write_json("amp_stats.json", parts.policy.get_amp_stats())
            fields = run_end_fields(
                status=end.status,
                error=error,
                events_dropped=self.hub.dropped,
                epochs_completed=parts.state.epochs_completed,
                global_step=parts.loop.global_step,
                best_metric=parts.early_stopping.best,
            )
            progress, checkpoint = parts.state.progress, self.config.checkpoint
            fields |= {
                "last_checkpoint": parts.checkpointer.last_path,
                "elapsed_s": time.monotonic() - self._opened_at,
                "samples_per_s": progress.samples_per_s or None,
                "monitor": checkpoint.monitor if checkpoint.tracks_best else None,
                "best_value": progress.best_value,
                "best_checkpoint": progress.best_checkpoint,
                "stop_reason": progress.stop_reason,
                "run_dir": None if log.kept_dir is None else str(log.kept_dir),
            }
            (log.error if end.status in ("failed", "abandoned") else log.emit)("run_end", **fields)
        finally:
            try:
                if log is not None:
                    log.close()
                    if not abandoned:  # control goes back first: nothing more is started
                        self._write_reports(log)
            finally:
                parts.checkpointer.end_run()  # its lock, whatever ended the run
                self.hub.close()

    def _write_reports(self, log: RunLog) -> None:
        """Start writing the reports from the closed log (rank 0) in a child process, not
        waited for (``core.wait_for_reports`` does); a report that fails never fails the run."""
        wanted = self.config.logging.reports and self.parts.strategy.is_global_zero
        if not wanted or log.kept_dir is None:
            return
        try:
            start_reports(log.run_dir)
        except Exception as exc:
            _process_log.warning(
                "reports_failed", run_dir=str(log.run_dir), error=f"{type(exc).__name__}: {exc}"
            )

    # -- checkpoints ----------------------------------------------------------------------
    def resume(self) -> ResumePoint | None:
        parts = self.parts
        rng = parts.checkpointer.restore()
        if rng is None:
            return None
        self.validation.forget_missing()
        # The lineage's best checkpoints, of earlier runs too, are kept; the rest pruned.
        parts.checkpointer.keep_best([str(path) for _, path in parts.state.progress.top_k])
        return parts.state.resume_point(rng)

    def sanity_check(self) -> None:
        """Before the first training step of the run in progress: a few validation batches
        (``num_sanity_val_steps``), so a broken validation fails now, not after an epoch."""
        self.validation.sanity_check(self.stop)

    def save(self, reason: str, *, best: bool = False) -> str | None:
        parts = self.parts
        parts.loop.flush()  # the last step's readback: scheduler and statistics up to date
        if self.log is not None:
            self.log.drain()  # every record up to the checkpoint is on disk first
        path = parts.checkpointer.save(
            step=parts.loop.global_step,
            epoch=parts.state.epochs_completed,
            reason=reason,
            best=best,
        )
        return None if path is None else str(path)

    def next_due(self, step: int) -> int | None:
        """The next step after ``step`` at which a validation or a checkpoint is due."""
        every = self.config.checkpoint.checkpoint_every_n_steps  # fast_dev_run: saves none
        return next_multiple(step, self.validation.every_n_steps, every)

    def __call__(self, step: int) -> None:
        """After a step :meth:`next_due` named: validation, then the checkpoint, when due."""
        self.validation.validate_if_due(step, self.stop)
        if self.parts.checkpointer.due_after_step(step):
            self.save("step")

    # -- an epoch's end -------------------------------------------------------------------
    def end_epoch(
        self, epoch: int, stats: EpochStats, started: float, stop: threading.Event
    ) -> EpochEnd:
        parts, log, validation = self.parts, self.log, self.validation
        assert log is not None  # opened by open()
        progress = parts.state.progress
        progress.train_loss = train_loss = self._mean_over_ranks(stats.loss_sum, stats.samples)
        due = validation.due_after_epoch(epoch + 1)
        if due and validation.validate(epoch, stop).interrupted:
            return EpochEnd(interrupted=True)
        latest, validation.since_epoch_end = validation.since_epoch_end, None
        parts.state.epochs_completed = epoch + 1
        parts.checkpointer.mark_stale()  # a checkpoint of this step predates the epoch's end
        judge, epochs = self.judge, epoch + 1  # each validation is a check, once
        if judge.at_epoch_end:
            judge.check(validation.values(None, train_loss), epochs=epochs, stop=stop)
        elif due:
            judge.check(validation.values(latest, train_loss), epochs=epochs, stop=stop)
        else:
            judge.due(epochs=epochs, stop=stop)
        if latest is not None and validation.last_step == parts.loop.global_step:
            validation.keep_if_best(validation.values(latest, train_loss))  # saved now
        elif self.config.checkpoint.monitor == "train_loss":
            validation.keep_if_best(validation.values(None, train_loss))
        parts.distribution.record_epoch(stats.samples, stats.time_s)
        self._epoch_record(log, epoch, stats, started)
        if parts.checkpointer.due_after_epoch(parts.state.epochs_completed):
            self.save("epoch")
        return EpochEnd(stop=progress.stopped_early)

    def _mean_over_ranks(self, total: float, count: int) -> float:
        sums = self.parts.strategy.all_reduce_sum(torch.tensor([total, count], dtype=torch.float64))
        return float(sums[0] / sums[1])

    def _epoch_record(self, log: RunLog, epoch: int, stats: EpochStats, started: float) -> None:
        parts = self.parts
        progress = parts.state.progress
        verdict = epoch_verdict(stats.time_s, stats.data_time_s, parts.monitor, started)
        log.emit(
            "epoch_end",
            epoch=epoch,
            step=parts.loop.global_step,
            train_loss=progress.train_loss,
            val_loss=progress.val_loss,
            val_accuracy=progress.val_accuracy,
            val_metrics=dict(progress.val_metrics),
            steps=stats.steps,
            skipped_steps=stats.skipped_steps,
            samples=stats.samples,
            epoch_time_s=stats.time_s,
            data_time_s=stats.data_time_s,
            samples_per_s=stats.samples / stats.time_s if stats.time_s else None,
            early_stopping_bad_epochs=parts.early_stopping.bad_epochs,
            stopped_early=progress.stopped_early,
            input_stall_fraction=verdict["input_stall_fraction"],
            util_mean_pct=verdict["util_mean_pct"],
            bottleneck=verdict["verdict"],
            bottleneck_advice=verdict["advice"],
            **parts.policy.epoch_fields(),
        )
        log.write_json("amp_stats.json", parts.policy.get_amp_stats())
        log.drain()

"""Everything a checkpoint holds besides model and optimizer tensors, in one object."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from core.checkpointing.compatibility import finished
from core.loop.accumulation import Accumulation
from core.loop.epoch import EpochStats, ResumePoint, Scheduler, StepLoop
from core.loop.recovery import ErrorHandler
from core.precision.policy import PrecisionPolicy
from core.stopping.early_stopping import EarlyStopping
from core.trainer.state.results import RunProgress

__all__ = ("RunState",)


class RunState:
    """Epochs completed, the run's tally, and the resumable parts of every component."""

    def __init__(
        self,
        *,
        loop: StepLoop,
        mixed_precision: PrecisionPolicy,
        accumulation: Accumulation,
        scheduler: Scheduler | None,
        early_stopping: EarlyStopping,
        errors: ErrorHandler,
        fingerprint: dict[str, Any],
        max_epochs: int,
        max_steps: int | None,
        train_loader: Iterable[Any] = (),
    ) -> None:
        self.loop = loop
        self.mixed_precision = mixed_precision
        self.accumulation = accumulation
        self.scheduler = scheduler
        self.early_stopping = early_stopping
        self.errors = errors
        loop.order_of(train_loader)  # the resumed record says whether its order is restored
        self._fingerprint = fingerprint
        self._max_epochs, self._max_steps = max_epochs, max_steps
        self.epochs_completed = 0
        self.progress = RunProgress()

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)

    def finished(self, trainer: dict[str, Any]) -> str | None:
        """Why the run of a checkpoint's trainer state has ended under this run's limits."""
        return finished(trainer, max_epochs=self._max_epochs, max_steps=self._max_steps)

    def rng_at_epoch_start(self) -> dict[str, Any]:
        return self.loop.epoch_rng

    def rng_now(self) -> dict[str, Any]:
        return self.loop.rng_now()

    def data_order(self) -> dict[str, Any]:
        """The ``resumed`` record's ``data_order`` fields: whether a resume continues onto the
        batches an uninterrupted run would train on."""
        why = self.loop.order.unrestorable(epoch=self.epochs_completed)
        return {"data_order": "not_restored" if why else "restored", "data_order_detail": why}

    def state_dict(self) -> dict[str, Any]:
        return {
            "global_step": self.loop.global_step,
            "epoch": self.epochs_completed,
            "loop": self.loop.state_dict(),
            "precision": self.mixed_precision.state_dict(),
            "accumulation": self.accumulation.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "early_stopping": self.early_stopping.state_dict(),
            "errors": self.errors.state_dict(),
            "progress": asdict(self.progress),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs_completed = int(state["epoch"])
        self.loop.load_state_dict(state["loop"])
        self.mixed_precision.load_state_dict(state["precision"])
        self.accumulation.load_state_dict(state["accumulation"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.early_stopping.load_state_dict(state["early_stopping"])
        self.errors.load_state_dict(state["errors"])
        self.progress = RunProgress(**state["progress"])

    def resume_point(self, rng: dict[str, Any]) -> ResumePoint:
        """Where the first epoch after a resume starts (``rng``: this rank's saved states)."""
        loop = self.loop
        if loop.epoch != self.epochs_completed:  # saved at an epoch end: a fresh epoch
            return ResumePoint(0, EpochStats(epoch=self.epochs_completed), rng["now"], rng["now"])
        stats = loop.state_dict()["epoch_stats"]
        return ResumePoint(loop.batches_done, EpochStats(**stats), rng["epoch_start"], rng["now"])

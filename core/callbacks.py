"""Observers of a run: ``Callback`` and its async no-op hooks. They are fed on the event loop
(never on the step thread) with the records ``events.jsonl`` receives. A hook that raises is
reported once (``callback_failed``, with its traceback; on stderr too) and not called again;
one that falls ``event_buffer_size`` records behind loses the oldest (``callback_lagging``);
after the run, callbacks get ``logging.callback_grace_s`` to finish. A hook must not block
the event loop. Steering with ``run.request_stop(reason)``: docs/lightning.md#callbacks-that-steer.

Example::

    class LossCurve(Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        async def on_epoch_end(self, run: RunInfo, record: Record) -> None:
            self.losses.append(record["train_loss"])

    async with TrainingJob(config, model=m, train_loader=dl, callbacks=[LossCurve()]) as run:
        await run.train()
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from core.config import TrainingConfig

__all__ = ("Callback", "Record", "RunInfo")

Record = dict[str, Any]


class RunInfo(Protocol):
    """What a callback may read about the run it observes."""

    @property
    def config(self) -> TrainingConfig: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def is_global_zero(self) -> bool: ...
    @property
    def run_dir(self) -> Path | None: ...
    def request_stop(self, reason: str) -> bool:
        """Stop the run at its next step boundary, as Lightning's ``trainer.should_stop``
        does: the stop checkpoint is written, ``train()`` returns, ``run_end`` has
        ``status="stopped"`` and ``stop_reason="requested: <reason>"``. False when no run
        is in progress (``on_run_end`` included: the run's end is written)."""
        ...


class Callback:
    """Base class of run observers: override the hooks you need (all async, all no-ops).

    ``on_record`` receives every record; the others receive theirs after ``on_record``;
    ``on_run_closed`` comes last, once the run's files are complete.
    """

    steers_each_step: ClassVar[bool] = False
    """True: in a run in this process, the step thread waits after each optimizer step until
    this callback has handled that step's ``train_step`` record, so a ``request_stop`` from
    ``on_train_step`` stops the run at that step, as Lightning's ``on_train_batch_end`` does.
    It costs a host sync (the step's readback, no longer lagged) and a round trip to the
    event loop per step. Under ``isolation="process"`` and ``devices=N`` it is ignored: the
    stop lands within the bound docs/lightning.md#callbacks-that-steer states."""

    async def on_run_start(self, run: RunInfo, record: Record) -> None:
        """The ``run_start`` record: the config tree, what it resolved to, the device."""

    async def on_record(self, run: RunInfo, record: Record) -> None:
        """Every record of the run, in order (``train_step``, ``gpu_sample``, ...)."""

    async def on_train_step(self, run: RunInfo, record: Record) -> None:
        """Each ``train_step`` record: one per optimizer step, arriving one step after its step
        ran (its scalars are read back during the next) plus the log's drain (at most
        ``logging.flush_interval_s``); with ``steers_each_step``, before the next step. Under
        ``devices=N`` the caller's callbacks see rank 0's."""

    async def on_validation_end(self, run: RunInfo, record: Record) -> None:
        """Each ``validation`` record: ``val_loss``, ``val_accuracy``, ``metrics``."""

    async def on_epoch_end(self, run: RunInfo, record: Record) -> None:
        """The ``epoch_end`` record (after validation)."""

    async def on_checkpoint(self, run: RunInfo, record: Record) -> None:
        """A ``checkpoint`` record: a checkpoint was committed (its ``path`` is in it)."""

    async def on_run_end(self, run: RunInfo, record: Record) -> None:
        """The ``run_end`` record: status, steps, the last good checkpoint."""

    async def on_run_closed(self, run: RunInfo) -> None:
        """Once, after this callback handled the run's last record: the run's files are
        complete (``events.jsonl`` closed; ``training_metrics.png`` and
        ``performance_summary.txt`` written into ``run.run_dir`` when reports are on).
        Trackers upload their artifacts here."""

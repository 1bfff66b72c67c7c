"""Observers of a run: ``Callback`` and its async no-op hooks.

A callback sees the records ``events.jsonl`` receives, as they are written, on the event
loop (never on the step thread). It is isolated: a hook that raises is reported once (an
``error`` record, ``kind="callback_failed"``) and that callback is not called again in the
run; a callback that falls more than ``event_buffer_size`` records behind loses the oldest
(reported once, ``callback_lagging``). Training never waits for a callback; after the run
ends, callbacks get up to ``logging.callback_grace_s`` (10 s) to finish the last records.

Progress bars, trackers and report writers are callbacks; what the step loop must do at a
step (a checkpoint due, a profiler step) is not: it is a step hook of the loop.

Example::

    class LossCurve(Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        async def on_epoch_end(self, run: RunInfo, record: Record) -> None:
            self.losses.append(record["train_loss"])

    curve = LossCurve()
    async with TrainingJob(config, model=m, train_loader=dl, callbacks=[curve]) as run:
        await run.train()

A callback may also steer: ``run.request_stop(reason)`` from any hook stops the run at its
next step boundary, on every run mode (a thread, ``isolation="process"``, ``devices=N``)::

    class StopOnBudget(Callback):
        def __init__(self, samples: int) -> None:
            self.budget, self.seen = samples, 0

        async def on_train_step(self, run: RunInfo, record: Record) -> None:
            self.seen += record["samples"]
            if self.seen >= self.budget:
                run.request_stop(f"the budget of {self.budget} samples is spent")

Hooks see records as they are written: a ``train_step`` record arrives one step after its
step ran (its scalars are read back during the next step) plus the log's drain (at most
``logging.flush_interval_s``), so a stop requested from ``on_train_step`` lands a few steps
after the step that prompted it. Under ``devices=N`` the callbacks of the caller see rank
0's records.

A hook must not block the event loop: hand slow work to a thread
(``await anyio.to_thread.run_sync(...)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

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
        is in progress."""
        ...


class Callback:
    """Base class of run observers: override the hooks you need (all async, all no-ops).

    ``on_record`` receives every record; the others receive theirs after ``on_record``;
    ``on_run_closed`` comes last, once the run's files are complete.
    """

    async def on_run_start(self, run: RunInfo, record: Record) -> None:
        """The ``run_start`` record: the config tree, what it resolved to, the device."""

    async def on_record(self, run: RunInfo, record: Record) -> None:
        """Every record of the run, in order (``train_step``, ``gpu_sample``, ...)."""

    async def on_train_step(self, run: RunInfo, record: Record) -> None:
        """Each ``train_step`` record: one per optimizer step, on the event loop, never on
        the step thread's path (see the module docstring for the lag)."""

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

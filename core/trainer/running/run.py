"""One call of ``train()``: the step thread, the tasks beside it, and how the run ends.

The event loop only schedules: the run's synchronous work runs on the step thread; beside it
run the log drain, the data watchdog, the signal watcher, the monitor and the callbacks.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc

from core.config import TrainingConfig
from core.errors import (
    BatchFormatError,
    LossFormatError,
    NonFiniteLossError,
    OutOfMemoryError,
    SignalReceived,
    TrainingStepError,
)
from core.loop.epoch import ResumePoint
from core.telemetry.events import EventHub
from core.trainer.assembly.build import Parts
from core.trainer.epochs.cycle import RunCycle
from core.trainer.running.agreement import agree_on_outcome
from core.trainer.running.async_tools import drain_periodically, to_the_end, watch_data_stalls
from core.trainer.running.observers import Observers
from core.trainer.running.signals import watch_stop_signals
from core.trainer.running.step_thread import StepThread
from core.trainer.running.stopping import Stopping
from core.trainer.state.results import RunEnding, TrainingResults

__all__ = ("Run",)

R = TypeVar("R")

# What a step or a validation raises where the last completed step is sound: its checkpoint
# keeps the work (user code that failed, malformed data or losses, memory, non-finite steps).
_CHECKPOINT_AFTER = (
    TrainingStepError,
    NonFiniteLossError,
    OutOfMemoryError,
    LossFormatError,
    BatchFormatError,
)


class Run:
    """A run of one job, from ``run_start`` to ``run_end``."""

    def __init__(
        self,
        config: TrainingConfig,
        parts: Parts,
        cycle: RunCycle,
        hub: EventHub,
        observers: Observers,
    ) -> None:
        self.config = config
        self.parts = parts
        self.cycle = cycle
        self.hub = hub
        self.observers = observers
        loop, settings = parts.loop, config.run
        self.worker = StepThread(
            cycle.new_stop(),
            grace_s=settings.stop_grace_s,
            loader_grace_s=settings.loader_grace_s,
            waiting_for_data=loop.waiting_for_data,
            # One rank only: a stop checkpoint under several is a collective that a rank
            # parked in its loader cannot join.
            park=loop.park if parts.strategy.world_size == 1 else None,
        )
        self.end = RunEnding()
        self.agreed: BaseException | None = None  # what train() raises, agreed by every rank
        self.held: BaseException | None = None  # a rank's cancellation, until a stop vote
        self.ran_to_the_end = False  # the ranks ended before a vote: no stop checkpoint
        self.stopping = Stopping(
            checkpointer=parts.checkpointer,
            save=cycle.save,
            global_step=lambda: loop.global_step,
            grace_s=settings.stop_grace_s,
            log=cycle.current,
        )

    async def execute(
        self, description: dict[str, Any], *, on_open: Callable[[Path], None]
    ) -> TrainingResults:
        """Run to the end; ``on_open`` learns the run's directory once it exists."""
        worker, end, observers = self.worker, self.end, self.observers
        self.hub.reopen()
        results: TrainingResults | None = None
        failure: Exception | None = None
        async with anyio.create_task_group() as watchers:  # the callbacks outlive the run
            observers.start(watchers, self.hub)
            try:
                results = await self._run(description, on_open)
            except Exception as exc:  # re-raised unwrapped, after the task group
                failure = exc
            except anyio.get_cancelled_exc_class():
                if end.error is None and end.status == "failed":  # before its supervision began
                    end.status = "cancelled"
                raise
            finally:
                if worker.abandoned:
                    end.status = "abandoned"
                await to_the_end(watchers, functools.partial(self._close, failure))
        if self.agreed is not None:  # every rank raises the same error
            raise self.agreed
        assert results is not None
        return results

    async def _close(self, failure: Exception | None) -> None:
        """``run_end``, the files, the hub; the callbacks' last hooks; how every rank ended."""
        worker, cycle, observers = self.worker, self.cycle, self.observers
        if cycle.log is not None:  # callbacks see every record before run_end
            await anyio.to_thread.run_sync(cycle.log.drain)
        await observers.catch_up()
        await anyio.to_thread.run_sync(
            functools.partial(cycle.close, self.end, abandoned=worker.abandoned)
        )
        worker.close()
        await observers.finish()
        if cycle.log is not None:  # a smoke run's temporary directory, once nothing writes
            await anyio.to_thread.run_sync(cycle.log.discard)
        # Peers close within their callbacks' grace; a stop that gave up on its step thread
        # gives control back first, and waits for the others briefly.
        wait_s = 5.0 if worker.abandoned else self.config.logging.callback_grace_s + 10
        last = self.parts.checkpointer.last_path
        self.agreed = await anyio.to_thread.run_sync(
            agree_on_outcome, self.parts.strategy, failure, last and str(last), wait_s
        )

    async def _run(
        self, description: dict[str, Any], on_open: Callable[[Path], None]
    ) -> TrainingResults:
        """Open the run, then supervise it beside the log drain, the watchdogs and the monitor."""
        parts, cycle, run = self.parts, self.cycle, self.config.run
        worker, end, stopping = self.worker, self.end, self.stopping
        log = await self._call_on_every_rank(cycle.open, description)
        on_open(log.run_dir)
        log.drain()  # run_start reaches the callbacks once run_dir is known, not before
        run_scope = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain_periodically, log, self.config.logging.flush_interval_s)
            tg.start_soon(watch_data_stalls, parts.loop, log, run.data_stall_warn_s)
            if run.handle_signals:
                tg.start_soon(
                    functools.partial(
                        watch_stop_signals,
                        run_scope,
                        end.signals,
                        on_hurry=functools.partial(stopping.hurry, worker),
                        on_force=stopping.force_exit,
                    )
                )
            if parts.monitor is not None:
                tg.start_soon(parts.monitor.run)
            try:
                return await self._supervise(run_scope, log.kept_dir)
            except Exception as exc:  # re-raised unwrapped, after the task group
                end.error = exc
            finally:
                tg.cancel_scope.cancel()
        assert end.error is not None
        raise end.error

    async def _supervise(
        self, run_scope: anyio.CancelScope, run_dir: Path | None
    ) -> TrainingResults:
        """The run itself, and the stop checkpoint whatever ends it."""
        worker, end, stopping, cycle = self.worker, self.end, self.stopping, self.cycle
        try:
            with run_scope:  # cancelled by the first stop signal
                resume = await self._call_on_every_rank(cycle.resume)
                await self._call_on_every_rank(cycle.sanity_check)  # a broken validation fails now
                results = await self._fit(resume, run_dir)
            if end.signals:
                end.status = "stopped"
                checkpoint = await stopping.checkpoint(worker, "signal")
                raise SignalReceived(end.signals[0], checkpoint, abandoned=worker.abandoned)
            if results.interrupted:
                await stopping.checkpoint(worker, "stopped_by_peer")
            requested = results.stop_reason is not None and not results.stopped_early
            end.status = "stopped" if results.interrupted or requested else "completed"
            return results
        except anyio.get_cancelled_exc_class():
            end.status = "cancelled"
            if not self.ran_to_the_end:
                await stopping.checkpoint(worker, "cancel")
            raise
        except _CHECKPOINT_AFTER:
            if self.parts.strategy.world_size == 1:
                await stopping.checkpoint(worker, "error", always=True)
            raise

    async def _fit(self, resume: ResumePoint | None, run_dir: Path | None) -> TrainingResults:
        parts, cycle, worker = self.parts, self.cycle, self.worker
        stop, progress, max_steps = worker.stop, parts.state.progress, self.config.run.max_steps
        if not progress.stopped_early:  # a resumed request was the earlier run's, not this one's
            progress.stop_reason = None
        for epoch in range(parts.state.epochs_completed, self.config.run.max_epochs):
            if max_steps is not None and parts.loop.global_step >= max_steps:
                break
            if progress.stopped_early:  # resumed from a run early stopping had ended
                break
            started = time.monotonic()  # the monitor's clock: the epoch's samples follow it
            stats = await self._call_on_every_rank(
                parts.loop.run_epoch, parts.train_loader, epoch, stop, resume
            )
            resume = None
            progress.add_epoch(stats.samples, stats.time_s)
            if stats.interrupted:
                await self._interrupted()
                break
            ended = await self._call_on_every_rank(cycle.end_epoch, epoch, stats, started, stop)
            if ended.interrupted:
                await self._interrupted()
                break
            if ended.stop:
                break
        if self.held is not None:  # cancelled in the last epoch's end, after the last vote
            self.ran_to_the_end = True
            raise self.held
        checkpoint = self.config.checkpoint
        return progress.results(
            epochs_completed=parts.state.epochs_completed,
            global_step=parts.loop.global_step,
            run_dir=run_dir,
            monitor=checkpoint.monitor if checkpoint.tracks_best else None,
            last_checkpoint=parts.checkpointer.last_path,
        )

    async def _call_on_every_rank(self, fn: Callable[..., R], *args: Any) -> R:
        """A job every rank runs to its end: opening, resuming, an epoch (whose votes may
        end it early) and an epoch's end."""
        result, interruption = await self.worker.call_through(fn, *args)
        if interruption is None:
            return result
        cancelled = isinstance(interruption, anyio.get_cancelled_exc_class())
        if self.parts.strategy.world_size == 1 or not cancelled:
            raise interruption
        # One rank of several must not leave alone (the others would wait for it in their
        # next collective): the cancellation is held until the next stop vote stops every
        # rank at one step boundary, where _interrupted raises it. An epoch that ended before
        # its next vote holds it too: another rank may be past the epoch's end already.
        self.held = self.held or interruption
        return result

    async def _interrupted(self) -> None:
        """After the ranks agreed to stop at a step boundary: re-raise a (held) cancellation,
        or checkpoint a stop this run decided, or end as interrupted by another rank."""
        await anyio.lowlevel.checkpoint()
        if self.held is not None:
            raise self.held
        progress, requested = self.parts.state.progress, self.cycle.requested
        if progress.stopped_early:
            await self.stopping.checkpoint(self.worker, "early_stop")
        elif requested is not None:
            progress.stop_reason = f"requested: {requested}"
            await self.stopping.checkpoint(self.worker, "requested")
        else:
            progress.interrupted = True

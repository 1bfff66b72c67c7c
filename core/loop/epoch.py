"""The synchronous step loop: epochs of optimizer steps.

Plain PyTorch, run in a worker thread by the orchestrator; nothing in here awaits. The loop
pulls windows of batches (its wait for data timed and parkable: :class:`DataWait`), runs
one optimizer step per window (``core.loop.step``), calls the step hooks that are due, and
stops at a step boundary all ranks agree on. It knows where it is (epoch, batches consumed,
the RNG states at the epoch's start and now) so a checkpoint can resume mid-epoch.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, replace
from functools import partial
from time import perf_counter
from typing import Any, NamedTuple

from core.data.batches import check_batch
from core.data.order import LoaderOrder
from core.errors import EmptyLoaderError
from core.hardware.device import device_of
from core.loop.recorder import EpochStats, Scheduler
from core.loop.schedule import StepHook, StepSchedule
from core.loop.step import OptimizerStep
from core.rng import capture_rng, restore_rng

__all__ = ("DataWait", "EpochStats", "ResumePoint", "Scheduler", "StepLoop")


class DataWait:
    """The step thread's wait for its next batch: the one moment it is provably outside any
    step. A stop that finds the thread waiting *parks* the wait (:meth:`park`): the thread
    never steps again, even if the loader returns later, and the run's state is that of the
    last step boundary, so the stop checkpoint can be written from another thread at once
    instead of after a hung loader's timeout. Each epoch has a wait object of its own: a
    thread parked in an earlier ``train()`` never touches a later run's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # perf_counter() when the thread asked the loader for its next batch, None when not
        # waiting: one store by the step thread, no lock (park() reads it once).
        self.since: float | None = None
        self._parked = False

    def end(self) -> bool:
        """The loader returned (or raised): True when the thread may go on, False when a stop
        parked it meanwhile (it must then leave without touching the run's state)."""
        with self._lock:
            self.since = None
            return not self._parked

    def park(self) -> bool:
        """From another thread: stop the step thread at this boundary if it waits for data.
        True when it did (the thread will never step again), False when it is in a step."""
        with self._lock:
            if self.since is None and not self._parked:
                return False
            self._parked = True
            return True


class ResumePoint(NamedTuple):
    """Where a checkpoint left an epoch: batches consumed, its statistics, the RNG states."""

    batches_done: int
    stats: EpochStats
    rng_epoch_start: dict[str, Any]
    rng_now: dict[str, Any]


class StepLoop:
    """Runs optimizer steps for the orchestrator; owns no thread and no file.

    ``step_hooks`` run on the step thread after the optimizer steps each one names (a plain
    callable: after every step); more are added to :attr:`schedule`. The epoch ends early
    once ``max_steps`` optimizer steps were taken.
    """

    def __init__(
        self,
        step: OptimizerStep,
        *,
        step_hooks: Sequence[StepHook | Callable[[int], None]] = (),
        max_steps: int | None = None,
    ) -> None:
        self.optimizer_step = step
        self.model = step.model
        self.accumulation = step.accumulation
        self.strategy = step.strategy
        self.errors = step.errors
        self.emit = step.emit
        self.recorder = step.recorder
        self.schedule = StepSchedule(step_hooks)
        self.max_steps = max_steps
        self.clear_cache = step.policy.config.clear_cache
        self.global_step = 0
        self.epoch = 0
        self.batches_done = 0
        self.epoch_rng: dict[str, Any] = {}
        self.order = LoaderOrder(())  # the train loader's: set by order_of() or an epoch
        self.data_wait = DataWait()  # replaced every epoch: read by watchdogs and stops

    # -- an epoch -------------------------------------------------------------------------
    def run_epoch(
        self,
        loader: Iterable[Any],
        epoch: int,
        stop: threading.Event,
        resume: ResumePoint | None = None,
    ) -> EpochStats:
        """Train one epoch (the rest of it after ``resume``); return early, at a step
        boundary all ranks agree on, once ``stop`` is set."""
        self.model.train()
        strategy = self.strategy
        strategy.set_epoch(loader, epoch)
        lockstep = strategy.lockstep(loader, "train_loader", epoch=epoch)  # uneven: raises
        # Streams: every rank ends the epoch where the first one runs out, agreed before each
        # step (lengths known: they end together, nothing to ask).
        agree_each_step = lockstep.agrees_each_step
        votes = strategy.stop_vote_interval  # None: this process stops on its own flag
        batches = self._open_epoch(loader, epoch, resume)
        stats = self.recorder.stats
        check = partial(check_batch, epoch=epoch)
        windows = self.accumulation.windows(batches, check, start_index=self.batches_done)
        optimizer_step, max_steps = self.optimizer_step, self.max_steps
        due = self.schedule.start(self.global_step)  # the next step a hook waits for
        started = tick = perf_counter()
        wait = self.data_wait = DataWait()
        while True:
            wait.since = tick
            try:
                window = next(windows, None)
            except Exception as exc:
                if not wait.end():  # parked by a stop: the run has moved on without us
                    return EpochStats(epoch=epoch, interrupted=True)
                raise self._failure(exc, "loading a batch", self.batches_done) from exc
            if not wait.end():  # parked by a stop, whose checkpoint holds this boundary
                return EpochStats(epoch=epoch, interrupted=True)
            if agree_each_step:
                uneven = lockstep.uneven_end(0 if window is None else len(window.batches))
                if uneven is not None:
                    self.emit(
                        "uneven_inputs",
                        epoch=epoch,
                        step=self.global_step,
                        loader="train_loader",
                        **uneven,
                    )
                    break
            if window is None:
                break
            step = self.global_step + 1
            try:
                optimizer_step(
                    window, step=step, epoch=epoch, started=tick, data_time_s=perf_counter() - tick
                )
            except Exception as exc:
                raise self._failure(exc, "the step", window.first_batch_index) from exc
            self.global_step = step
            self.batches_done = window.first_batch_index + len(window.batches)
            if step == due:
                due = self.schedule.reached(step)
            if max_steps is not None and step >= max_steps:
                break  # every rank steps in lockstep: all end here together
            tick = perf_counter()
            if votes is None:
                if stop.is_set():
                    stats.interrupted = True
                    break
            else:
                # Cast every `votes` steps, counted at the next one (each rank cast it a step
                # ago): a stop lands within votes + 1 steps, the same step on every rank.
                voted = step % votes == 0
                if strategy.vote_on_stop(stop.is_set()) if voted else strategy.settle_stop_votes():
                    stats.interrupted = True
                    break
        stats.interrupted |= self.strategy.settle_stop_votes()
        self.flush()
        stats.time_s += perf_counter() - started
        if self.clear_cache:
            device_of(self.strategy.device).empty_cache()  # a device sync, once per epoch
        if stats.steps == 0 and not stats.interrupted:
            raise EmptyLoaderError(
                f"train_loader yielded no batch in epoch {epoch}; allowed: a loader with at "
                "least one batch. Fix: check the dataset length and drop_last."
            )
        return stats

    def _open_epoch(
        self, loader: Iterable[Any], epoch: int, resume: ResumePoint | None
    ) -> Iterator[Any]:
        """The epoch's batches; after ``resume``, the same order, consumed ones skipped."""
        self.epoch = epoch
        order = self.order_of(loader)
        if resume is None or resume.batches_done == 0:
            if resume is not None:
                _restore(resume.rng_now, order)
            self.batches_done = 0
            self.recorder.stats = EpochStats(epoch=epoch)
            self.epoch_rng = _capture(order)  # before the loader draws its shuffle seed
            return iter(loader)
        _restore(resume.rng_epoch_start, order)
        self.epoch_rng = resume.rng_epoch_start
        iterator = iter(loader)
        for _ in itertools.islice(iterator, resume.batches_done):
            pass  # the same shuffle: consume what the interrupted run had trained on
        _restore(resume.rng_now, order)
        self.batches_done = resume.batches_done
        self.recorder.stats = replace(resume.stats, interrupted=False)
        return iterator

    def order_of(self, loader: Iterable[Any]) -> LoaderOrder:
        """What decides ``loader``'s order (:attr:`order` from now on, the train loader)."""
        if self.order.loader is not loader:
            self.order = LoaderOrder(loader)
        return self.order

    def rng_now(self) -> dict[str, Any]:
        """The RNG states now: the global generators' and the train loader's own."""
        return _capture(self.order)

    def _failure(self, exc: Exception, phase: str, batch_index: int) -> BaseException:
        timeout = getattr(self.strategy, "timeout_s", None)
        return self.errors.step_error(
            exc,
            epoch=self.epoch,
            step=self.global_step + 1,
            batch_index=batch_index,
            rank=self.strategy.rank,
            timeout_s=timeout,
            phase=phase,
        )

    @property
    def waiting_for_data_since(self) -> float | None:
        """``perf_counter()`` when the loop asked its loader for the next batch, if it waits."""
        return self.data_wait.since

    def waiting_for_data(self) -> bool:
        return self.data_wait.since is not None

    def park(self) -> bool:
        """From another thread: stop this loop for good if it waits for data (``DataWait``)."""
        return self.data_wait.park()

    def flush(self) -> None:
        """Settle the last step (end of epoch, before a checkpoint or a stop)."""
        self.recorder.settle()

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "epoch_stats": asdict(self.recorder.stats),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state["global_step"])
        self.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])
        self.recorder.stats = EpochStats(**state["epoch_stats"])


def _capture(order: LoaderOrder) -> dict[str, Any]:
    return {**capture_rng(), "loader": order.capture()}


def _restore(state: dict[str, Any], order: LoaderOrder) -> None:
    restore_rng(state)
    order.restore(state.get("loader"))  # absent from checkpoints written before it was saved

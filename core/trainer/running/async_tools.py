"""Small coroutines the orchestrator runs beside the step thread."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Protocol

import anyio
import anyio.abc

from core.telemetry.run_log import RunLog

__all__ = ("drain_periodically", "to_the_end", "watch_data_stalls")

_UNTIL_THE_FIRST_STEP_S = 0.02


async def drain_periodically(log: RunLog, interval_s: float) -> None:
    """Write queued records in a worker thread (neither the step thread nor the event loop's
    does the file I/O), then wake the ``events()`` consumers with records waiting."""
    # A drain competes for a core with the step: every ``interval_s`` (0.25 s keeps it below
    # 1% on a 2-core CPU). Until the first train_step, every 20 ms: whoever waits for training
    # to begin (a service's readiness, a launch timed to its first step) sees it at once.
    while not log.wrote_a_step:
        await anyio.sleep(min(interval_s, _UNTIL_THE_FIRST_STEP_S))
        await _drain(log)
    while True:
        await anyio.sleep(interval_s)
        await _drain(log)


async def _drain(log: RunLog) -> None:
    # Nothing queued (a run still building, a step thread that drained itself): no thread
    # hop, which costs the loop's thread more than the glance, ten runs starting at once.
    if log.queued:
        await anyio.to_thread.run_sync(log.drain)
    log.wake_consumers()


class WaitsForData(Protocol):
    """The step loop as the data watchdog sees it."""

    epoch: int
    batches_done: int

    @property
    def waiting_for_data_since(self) -> float | None:
        """``perf_counter()`` when the loop asked the loader for its next batch; None otherwise."""
        ...


async def watch_data_stalls(loop: WaitsForData, log: RunLog, warn_after_s: float) -> None:
    """A ``data_stall`` warning once the loader has not delivered for ``warn_after_s``, again
    after 2x, 4x, ... that long (the same wait)."""
    check_every = min(1.0, warn_after_s / 4)
    warned_wait: float | None = None
    next_warning_s = warn_after_s
    while True:
        await anyio.sleep(check_every)
        since = loop.waiting_for_data_since
        if since is None:
            continue
        if since != warned_wait:  # a new wait: start the backoff over
            warned_wait, next_warning_s = since, warn_after_s
        waited = perf_counter() - since
        if waited >= next_warning_s:
            log.warning(
                "data_stall",
                epoch=loop.epoch,
                batch_index=loop.batches_done,
                waited_s=round(waited, 3),
                next_warning_after_s=2 * next_warning_s,
                advice="the loader has not returned a batch: check its workers, storage "
                "and network; a stop request is honoured within stop_grace_s",
            )
            await anyio.to_thread.run_sync(log.drain)
            next_warning_s *= 2


async def to_the_end(tg: anyio.abc.TaskGroup, closing: Callable[[], Awaitable[None]]) -> None:
    """Run ``closing`` to its end in a shielded task of its own, and wait for it."""
    done, failed = anyio.Event(), list[Exception]()

    async def close() -> None:
        try:
            with anyio.CancelScope(shield=True):
                await closing()
        except Exception as exc:  # raised by the waiting task, not by the task group
            failed.append(exc)
        finally:
            done.set()

    tg.start_soon(close)
    while not done.is_set():
        try:
            with anyio.CancelScope(shield=True):
                await done.wait()
        except anyio.get_cancelled_exc_class():  # a native cancellation, through the shield
            continue  # the first one propagates once closing has ended
    if failed:
        raise failed[0]

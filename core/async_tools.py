"""Small coroutines and wrappers the orchestrator composes its run from."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

from core.openmp import release_thread_pool
from core.telemetry import RunLog

__all__ = ("drain_periodically", "in_step_thread", "stop_when_cancelled")

R = TypeVar("R")


async def in_step_thread(fn: Callable[..., R], *args: Any) -> R:
    """Run ``fn`` in a worker thread, with one OpenMP pool alive at a time (core.openmp)."""
    release_thread_pool()  # the event loop thread's, before the step thread builds its own
    return await anyio.to_thread.run_sync(_releasing_pool, fn, *args)


def _releasing_pool(fn: Callable[..., R], *args: Any) -> R:
    try:
        return fn(*args)
    finally:
        release_thread_pool()  # the step thread's: the application's own torch code stays fast


async def drain_periodically(log: RunLog, interval_s: float) -> None:
    """Write queued records from the event loop, so the step thread never does I/O.

    Each drain competes for a core with the step; a quarter of a second keeps that cost
    below 1% on a 2-core CPU while the log and ``events()`` stay near-live.
    """
    while True:
        await anyio.sleep(interval_s)
        log.drain()


async def stop_when_cancelled(stop: threading.Event) -> None:
    """Set ``stop`` when the task group is cancelled: the step thread sees it at the next
    step boundary (``to_thread`` itself is shielded and would not notice)."""
    try:
        await anyio.sleep_forever()
    finally:
        stop.set()

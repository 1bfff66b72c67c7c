"""How many runs' start work (checks, building, what crosses) runs in worker threads at once.

Runs started together in one service each hand their start work to a worker thread. That work
is Python, holding the interpreter lock: ten at once start no sooner than two, but each is one
more thread started from the event loop's thread (which waits there until the new thread runs)
and one more thread the loop's next wake-up queues behind for the lock. Two at a time, so
that one start that blocks without the lock (a process group joining, a slow first batch)
does not hold up every other::

    parts = await anyio.to_thread.run_sync(build, limiter=run_starts())
"""

from __future__ import annotations

import anyio
from anyio.lowlevel import RunVar

__all__ = ("AT_ONCE", "run_starts")

AT_ONCE = 2
"""Runs whose start work runs at once, per event loop."""

_LIMITER: RunVar[anyio.CapacityLimiter] = RunVar("core_run_starts")


def run_starts() -> anyio.CapacityLimiter:
    """This event loop's limiter of start work (one per loop: a limiter belongs to its loop)."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(AT_ONCE)
        _LIMITER.set(limiter)
        return limiter

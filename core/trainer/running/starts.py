"""How many runs' start work (checks, building, what crosses) runs in worker threads at once.

That work holds the interpreter lock: ten at once start no sooner than two, but each more
thread stalls the event loop's thread. Two, so one start blocked without the lock (a process
group joining, a slow first batch) does not hold up every other.
"""

from __future__ import annotations

import anyio
from anyio.lowlevel import RunVar

__all__ = ("AT_ONCE", "run_starts")

AT_ONCE = 2  # runs whose start work runs at once, per event loop

_LIMITER: RunVar[anyio.CapacityLimiter] = RunVar("core_run_starts")


def run_starts() -> anyio.CapacityLimiter:
    """This event loop's limiter of start work (one per loop: a limiter belongs to its loop)."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(AT_ONCE)
        _LIMITER.set(limiter)
        return limiter

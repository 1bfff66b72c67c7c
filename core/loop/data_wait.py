"""The step thread's wait for its next batch: the one moment it is provably outside any step.

A stop that finds the step thread waiting for its loader need not wait for the loader: it
*parks* the wait (:meth:`DataWait.park`). The thread then never steps again, even if the
loader returns later; it drops what it got and leaves the epoch. Until the wait ends, the
run's state (weights, optimizer, step counters, position in the epoch) is exactly that of
the last step boundary, so the stop checkpoint can be written from another thread at once,
instead of after a hung loader's timeout.

Each epoch has a wait object of its own: a thread parked in an earlier ``train()`` never
touches a later run's.
"""

from __future__ import annotations

import threading

__all__ = ("DataWait",)


class DataWait:
    """Whether the step thread waits for data (since when), and whether a stop parked it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None
        """``perf_counter()`` when the thread asked the loader for its next batch; None when
        it is not waiting for one. The step thread sets it before asking (one store: no lock
        is needed, as :meth:`park` reads it once), and :meth:`end` clears it."""
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

    @property
    def parked(self) -> bool:
        return self._parked

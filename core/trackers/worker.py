"""The one thread a tracker's backend runs on, so its I/O never blocks the event loop. Calls
run in submission order; submitting does not wait (MLflow creating its database takes
seconds) unless more than ``max_pending`` are queued. After a call raises, later ones are
skipped and :meth:`BackendThread.settle` raises that error; :meth:`BackendThread.close` still
runs its cleanup call.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anyio
import anyio.to_thread
import structlog

__all__ = ("BackendThread", "import_lock")

_log = structlog.get_logger("core")

import_lock = threading.Lock()
"""Held by trackers while they import their backend on their thread: two packages imported
at once from two threads can deadlock on each other's module locks (a shared dependency)."""


class BackendThread:
    """A single worker thread running a tracker's backend calls in order."""

    def __init__(self, name: str, *, max_pending: int = 8) -> None:
        self.name = name
        self.error: Exception | None = None
        self._max_pending = max_pending
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"core-{name}")
        self._pending: deque[Future[None]] = deque()
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)``; skipped once an earlier call has raised."""
        if self._closed:
            return

        def call() -> None:
            if self.error is None:
                try:
                    fn(*args)
                except Exception as exc:  # raised on the event loop by settle()
                    self.error = exc

        self._pending.append(self._executor.submit(call))

    async def settle(self, *, everything: bool = False) -> None:
        """Wait until at most ``max_pending`` calls are queued (``everything``: none), then
        raise the error of a call that failed, if one did."""
        while self._pending and (everything or len(self._pending) > self._max_pending):
            # A waiting thread, abandoned on cancellation; the call itself runs on.
            await anyio.to_thread.run_sync(self._pending[0].result, abandon_on_cancel=True)
            self._pending.popleft()
        while self._pending and self._pending[0].done():
            self._pending.popleft()
        if self.error is not None:
            raise self.error

    def close(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue the cleanup ``fn(*args)``, run even after an error (its own error is logged
        and kept unless an earlier one was), then let the thread end. Does not wait."""
        if self._closed:
            return
        self._closed = True

        def call() -> None:
            try:
                fn(*args)
            except Exception as exc:
                _log.warning("tracker_close_failed", tracker=self.name, error=repr(exc))
                if self.error is None:
                    self.error = exc

        self._pending.append(self._executor.submit(call))
        self._executor.shutdown(wait=False)

    async def finish(self, fn: Callable[..., Any], *args: Any) -> None:
        """:meth:`close` with ``fn(*args)``, wait for every call, raise a call's error."""
        self.close(fn, *args)
        await self.settle(everything=True)

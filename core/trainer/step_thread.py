"""The run's one worker thread, and the only way the async shell waits for it.

Every piece of synchronous work of a run (resuming, epochs, validation, saving) runs here,
in order, on one daemon thread: a thread stuck in a hung loader never blocks the
interpreter's exit, and a stop never races a step that is still running.

:meth:`StepThread.call` is where cancellation meets the thread. Whatever interrupts the
awaiting task (an anyio cancel scope, ``task.cancel()``, ``asyncio.wait_for``,
``asyncio.timeout``, Ctrl-C under ``asyncio.run``), ``call`` first sets the run's stop flag
and waits, shielded, for the job to return at a step boundary; only then does the
interruption go on. So a stop checkpoint is always written by an idle thread, and its step,
optimizer state and weights agree. If the job does not return within ``grace_s`` (a hung
loader, a stuck collective), the thread is *abandoned*: ``call`` lets the interruption
through, :attr:`StepThread.abandoned` turns true, and no later job is accepted.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

from core.errors import CoreError
from core.hardware.openmp import release_thread_pool

__all__ = ("StepThread", "StepThreadAbandoned")

R = TypeVar("R")


class StepThreadAbandoned(CoreError, RuntimeError):
    """Raised by :meth:`StepThread.call` after the thread was abandoned: it is still inside
    a job that did not reach a step boundary within the stop grace period."""


class _Job(Generic[R]):
    """One call: the function, its outcome, and how to wake the task awaiting it."""

    def __init__(self, fn: Callable[..., R], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.done = anyio.Event()
        self.finished = threading.Event()
        self.token = anyio.lowlevel.current_token()
        self.result: R | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:
            self.error = exc
        finally:
            self.finished.set()
            # An abandoned job's event loop may be gone: then there is nobody to wake.
            with contextlib.suppress(Exception):
                anyio.from_thread.run_sync(self.done.set, token=self.token)

    def outcome(self) -> R:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]  # set by run() when error is None


class StepThread:
    """A daemon thread running a run's synchronous jobs one at a time."""

    def __init__(self, stop: threading.Event, *, grace_s: float, name: str = "core-step") -> None:
        self.stop = stop
        self.grace_s = grace_s
        self.abandoned = False
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job.run()
            finally:
                release_thread_pool()  # between jobs, the application's torch code stays fast

    async def call(self, fn: Callable[..., R], *args: Any) -> R:
        """Run ``fn(*args)`` on the thread and return its result (or raise its error).

        Interrupted while waiting, it sets ``stop``, waits up to ``grace_s`` for ``fn`` to
        return, then re-raises the interruption; the thread is abandoned if ``fn`` is still
        running then."""
        if self.abandoned:
            raise StepThreadAbandoned(
                "the step thread is still stuck in an earlier job (it did not reach a step "
                "boundary within stop_grace_s); nothing more can run on it"
            )
        release_thread_pool()  # the event loop thread's, before the step thread uses its own
        job: _Job[R] = _Job(fn, args)
        self._jobs.put(job)
        try:
            await job.done.wait()
        except BaseException:
            self.stop.set()
            await self._settle(job)
            raise
        return job.outcome()

    async def _settle(self, job: _Job[Any]) -> None:
        """Wait, whatever else is cancelled meanwhile, until ``job`` returns or the grace ends."""
        deadline = anyio.current_time() + self.grace_s
        while not job.finished.is_set():
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                self.abandoned = True
                return
            try:
                with anyio.CancelScope(shield=True), anyio.move_on_after(remaining):
                    await job.done.wait()
            except anyio.get_cancelled_exc_class():  # a repeated native cancellation
                continue  # the first one is re-raised by call()

    def close(self) -> None:
        """Let the thread exit after its current job (it is a daemon either way)."""
        self._jobs.put(None)

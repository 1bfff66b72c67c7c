"""The run's one worker thread, and the only way the async shell waits for it.

Every piece of synchronous work of a run (resuming, epochs, validation, saving) runs here,
in order, on one daemon thread: a thread stuck in a hung loader never blocks the
interpreter's exit, and a stop never races a step that is still running.

:meth:`StepThread.call` is where cancellation meets the thread. Whatever interrupts the
awaiting task (an anyio cancel scope, ``task.cancel()``, ``asyncio.wait_for``,
``asyncio.timeout``, Ctrl-C under ``asyncio.run``), ``call`` first sets the run's stop flag
and waits, shielded, for the job to return at a step boundary; only then does the
interruption go on. So a stop checkpoint is always written from a step boundary, and its
step, optimizer state and weights agree. How long it waits depends on where the thread is:

- waiting for its loader (outside any step), at most ``loader_grace_s``: then the thread is
  *parked* (``core.loop.epoch.DataWait``): it will never step again, the run's state is that of
  the last boundary, and later jobs (the stop checkpoint, closing) run on a helper thread.
  Where parking is not possible (several ranks: the stop vote and the checkpoint are
  collectives a parked rank cannot join), a wait for data is given ``grace_s`` like a step:
  a slow loader (workers starting an epoch on a loaded machine) then delivers, the ranks
  vote and stop together with their checkpoint, and only a loader hung past ``grace_s``
  leaves the thread abandoned;
- inside a step, at most ``grace_s``: then the thread is *abandoned* (a stuck collective, a
  kernel that never returns): ``call`` lets the interruption through,
  :attr:`StepThread.abandoned` turns true, and no later job is accepted.

:meth:`StepThread.hurry` (a second stop signal) shortens both: a thread waiting for data is
parked at once, and a step gets at most ``HURRY_S`` more.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from core.errors import CoreError
from core.hardware.openmp import release_thread_pool

__all__ = ("HURRY_S", "StepThread", "StepThreadAbandoned")

HURRY_S = 5.0
"""After a second stop signal, the most a stop still waits for a running step."""
_POLL_S = 0.05  # how often a stop looks at where the thread is

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
    """A daemon thread running a run's synchronous jobs one at a time.

    ``waiting_for_data`` says whether the thread waits for its loader now; ``park`` stops
    it there for good (True when it did), or is None where that is not allowed."""

    def __init__(
        self,
        stop: threading.Event,
        *,
        grace_s: float,
        loader_grace_s: float | None = None,
        waiting_for_data: Callable[[], bool] = lambda: False,
        park: Callable[[], bool] | None = None,
        name: str = "core-step",
    ) -> None:
        self.stop = stop
        self.grace_s = grace_s
        self.loader_grace_s = grace_s if loader_grace_s is None else min(loader_grace_s, grace_s)
        self.abandoned = False
        self.parked = False
        self.waited_s = 0.0  # how long the last stop waited for the thread
        self.waited_for_data = False  # parked or abandoned while waiting for the loader
        self._waiting_for_data = waiting_for_data
        self._park = park
        self._hurried_at: float | None = None
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

        Interrupted while waiting, it sets ``stop``, waits for ``fn`` to return (see the
        module's docstring for how long), then re-raises the interruption. Once the thread
        is parked, jobs run on a helper thread (the parked one holds nothing)."""
        result, interruption = await self.call_through(fn, *args)
        if interruption is not None:
            raise interruption
        return result

    async def call_through(
        self, fn: Callable[..., R], *args: Any
    ) -> tuple[R, BaseException | None]:
        """:meth:`call`, except that an interruption while ``fn`` runs is returned beside
        its result, for the caller to raise later, instead of raised: ``(result, None)``
        when nothing interrupted. It is raised at once only where there is no result: the
        thread abandoned or parked, or ``fn`` raised."""
        if self.abandoned:
            raise StepThreadAbandoned(
                "the step thread is still stuck in an earlier job (it did not reach a step "
                "boundary within stop_grace_s); nothing more can run on it"
            )
        if self.parked:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args)), None
        release_thread_pool()  # the event loop thread's, before the step thread uses its own
        job: _Job[R] = _Job(fn, args)
        self._jobs.put(job)
        try:
            await job.done.wait()
        except BaseException as interruption:
            self.stop.set()
            await self._settle(job)
            if not job.finished.is_set() or job.error is not None:
                raise
            return job.outcome(), interruption
        return job.outcome(), None

    def hurry(self) -> None:
        """A second stop signal: park a thread that waits for data at once, and give a
        running step at most ``HURRY_S`` more."""
        if self._hurried_at is None:
            self._hurried_at = anyio.current_time()

    async def _settle(self, job: _Job[Any]) -> None:
        """Wait, whatever else is cancelled meanwhile, until ``job`` returns, or park or
        abandon the thread (see the module's docstring)."""
        began = anyio.current_time()
        data_since: float | None = None  # when this stop first saw the thread wait for data
        while not job.finished.is_set():
            now = anyio.current_time()
            self.waited_s = now - began
            deadline = began + self.grace_s
            if self._hurried_at is not None:
                deadline = min(deadline, self._hurried_at + HURRY_S)
            if self._park is not None and self._waiting_for_data():
                data_since = now if data_since is None else data_since
                if self._hurried_at is not None or now - data_since >= self.loader_grace_s:
                    self.waited_for_data = True
                    if self._park():
                        self.parked = True
                    else:
                        self.abandoned = True
                    return
            else:
                data_since = None
            if now >= deadline:
                self.waited_for_data = self._waiting_for_data()
                self.abandoned = True
                return
            try:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_POLL_S):
                    await job.done.wait()
            except anyio.get_cancelled_exc_class():  # a repeated native cancellation
                continue  # the first one is re-raised by call()

    def close(self) -> None:
        """Let the thread exit after its current job (it is a daemon either way)."""
        self._jobs.put(None)

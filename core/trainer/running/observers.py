"""Feeds each callback its own stream of the run's records, on the event loop, isolated.

Each callback has its own bounded subscription (a slow one only loses its own oldest records)
and its own shielded task (a cancelled run still delivers ``run_end``). A hook that raises is
reported once, with its traceback, in the run's log and on stderr.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import structlog

from core.callbacks import Callback, Record, RunInfo
from core.config import TrainingConfig
from core.console import ProgressBar
from core.loop.epoch import StepLoop
from core.telemetry.events import EventHub, EventStream
from core.telemetry.run_log import CurrentLog

__all__ = ("Observers", "StepGate", "with_default_callbacks")

Emit = Callable[..., None]
_HOOKS: dict[str, str] = {
    "run_start": "on_run_start",
    "train_step": "on_train_step",
    "validation": "on_validation_end",
    "epoch_end": "on_epoch_end",
    "checkpoint": "on_checkpoint",
    "run_end": "on_run_end",
}


def with_default_callbacks(
    callbacks: Sequence[Callback], config: TrainingConfig
) -> tuple[Callback, ...]:
    """``callbacks``, after a :class:`ProgressBar` when ``logging.progress`` and none is given."""
    given = tuple(callbacks)
    if not config.logging.progress or any(isinstance(c, ProgressBar) for c in given):
        return given
    return (ProgressBar(), *given)


class Observers:
    """The callbacks of one run, while it runs."""

    def __init__(
        self,
        callbacks: Sequence[Callback],
        run: RunInfo,
        *,
        report: Emit,
        warn: Emit,
        capacity: int,
        grace_s: float = 5.0,
    ) -> None:
        self._callbacks = tuple(callbacks)
        self._run = run
        self._report = report
        self._warn = warn
        self._capacity = capacity
        self.grace_s = grace_s
        self._scopes: list[anyio.CancelScope] = []
        self._streams: list[EventStream] = []
        self._busy = 0  # feeds inside a hook right now
        self._pending = 0
        self._done = anyio.Event()
        # The last train_step each callback that steers each step handled (inf: it ended).
        self._handled = {id(c): -math.inf for c in self._callbacks if c.steers_each_step}
        self._handled_changed = threading.Condition()

    @property
    def steering(self) -> bool:
        """Whether a callback steers each step (``Callback.steers_each_step``)."""
        return bool(self._handled)

    def wait_handled(self, step: int, stop: threading.Event) -> None:
        """On the step thread: wait until every callback that steers each step handled the
        ``train_step`` record of ``step`` (or ended), or ``stop`` is set (a stop, a
        cancellation: the thread must reach its step boundary)."""
        with self._handled_changed:
            while not stop.is_set() and min(self._handled.values(), default=step) < step:
                self._handled_changed.wait(0.05)  # also looks at stop, set without a notify

    def _mark_handled(self, callback: Callback, step: float) -> None:
        if id(callback) in self._handled:
            with self._handled_changed:
                self._handled[id(callback)] = step
                self._handled_changed.notify_all()

    def start(self, tg: anyio.abc.TaskGroup, hub: EventHub) -> None:
        """Subscribe every callback (before the run's first record) and start feeding it."""
        for callback in self._callbacks:
            scope = anyio.CancelScope(shield=True)
            self._scopes.append(scope)
            self._pending += 1
            lagging = functools.partial(self._lagging, type(callback).__name__)
            stream = hub.subscribe(self._capacity, on_first_drop=lagging)
            self._streams.append(stream)
            tg.start_soon(self._feed, callback, stream, scope)
        if not self._callbacks:
            self._done.set()

    def _lagging(self, name: str) -> None:
        """Report a callback's first lost record (queued: no I/O, any thread)."""
        self._warn(
            "callback_lagging",
            callback=name,
            dropped=1,
            effect="this callback misses the oldest records; training goes on",
        )

    async def catch_up(self) -> None:
        """Before ``run_end``: wait (shielded, at most ``grace_s / 2``) until every callback has
        handled the records so far, so a hook that fails on them is reported in the run's log."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.grace_s / 2):
            while not self._done.is_set() and (self._busy or any(s.backlog for s in self._streams)):
                for stream in self._streams:
                    if stream.backlog:
                        stream.wake()  # its consumer drains now, not at its next poll
                await anyio.sleep(0.002)

    async def finish(self) -> None:
        """After the hub closed: let callbacks finish, ``on_run_closed`` included, for at most
        ``grace_s``, then stop them."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.grace_s):
            await self._done.wait()
        for scope in self._scopes:
            scope.cancel()

    async def _feed(
        self, callback: Callback, stream: EventStream, scope: anyio.CancelScope
    ) -> None:
        name = type(callback).__name__
        try:
            with scope:
                async for record in stream:  # (the stream is closed when the run ends)
                    if not await self._deliver(callback, name, record):
                        return
                    if record.get("event") == "train_step":
                        self._mark_handled(callback, record["step"])
                await self._call(callback, name, "on_run_closed", None)
        finally:
            self._mark_handled(callback, math.inf)  # a step never waits for an ended feed
            self._streams.remove(stream)  # a feed that ended owes nothing to catch_up
            await stream.aclose()
            self._pending -= 1
            if self._pending == 0:
                self._done.set()

    async def _deliver(self, callback: Callback, name: str, record: Record) -> bool:
        """Call the hooks for ``record``; False after a hook failed (reported once)."""
        hooks: list[Callable[[RunInfo, Record], Awaitable[Any]]] = [callback.on_record]
        special = _HOOKS.get(record.get("event", ""))
        if special is not None:
            hooks.append(getattr(callback, special))
        for hook in hooks:
            if not await self._call(callback, name, hook.__name__, record):
                return False
        return True

    async def _call(self, callback: Callback, name: str, hook: str, record: Record | None) -> bool:
        """One hook (``record`` None: ``on_run_closed``); False after it raised (reported)."""
        self._busy += 1
        try:
            if record is None:
                await callback.on_run_closed(self._run)
            else:
                await getattr(callback, hook)(self._run, record)
        except Exception as exc:
            failure = {
                "callback": name,
                "hook": hook,
                "event_type": None if record is None else record.get("event"),
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(exc)),
                "effect": "this callback is not called again in this run; training goes on",
            }
            self._report("error", kind="callback_failed", **failure)
            console = {k: v for k, v in failure.items() if k != "traceback"}
            # Shown even with progress=False (no console shows the record then).
            _console_log().error("callback_failed", **console, exc_info=exc)
            return False
        finally:
            self._busy -= 1
        return True


def _console_log() -> Any:
    """The library's logger (``core``) as the application configured structlog; without a
    configuration, one writing to stderr (structlog's default writes to stdout, among a
    program's own output)."""
    if structlog.is_configured():
        return structlog.get_logger("core")
    return structlog.wrap_logger(structlog.PrintLogger(sys.stderr))


class StepGate:
    """A step hook of the loop, due after every step while a callback steers each step (none
    steers: never due, no cost): the step's ``train_step`` record is settled and published
    at once, and the loop goes on to its stop check once those callbacks handled it."""

    def __init__(self, loop: StepLoop, current: CurrentLog, hub: EventHub) -> None:
        self._loop = loop
        self._current = current
        self._hub = hub
        self._observers: Observers | None = None
        self._stop: threading.Event | None = None

    def attach(self, observers: Observers | None, stop: threading.Event | None) -> None:
        """The run's callbacks and stop flag (None, None: after the run)."""
        steering = observers is not None and observers.steering
        self._observers, self._stop = (observers, stop) if steering else (None, None)

    def next_due(self, step: int) -> int | None:
        return None if self._observers is None else step + 1

    def __call__(self, step: int) -> None:
        observers, stop, log = self._observers, self._stop, self._current.log
        if observers is None or stop is None or log is None or log.closed:
            return
        self._loop.flush()  # the step's readback now, not during the next: a host sync
        log.drain()
        self._hub.wake_all()  # the callbacks' streams drain now, not at their next poll
        observers.wait_handled(step, stop)

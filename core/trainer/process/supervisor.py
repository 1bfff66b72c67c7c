"""One ``train()`` in a supervised training process (``run.isolation="process"``).

The process is forked from a fork server, never from the service (``spawn``'s guarantees
without paying the imports for every run). The service's event loop only relays: pickling,
starting and reading records run in worker threads, and records reach the job's event hub.
How each ending (completed, failed, cancelled, died) reaches the caller: docs/services.md.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import anyio
import anyio.abc
import torch
from torch import nn

from core.checkpointing.weights import load_weights
from core.config import TrainingConfig
from core.errors import MainNotGuarded, TrainingProcessDied
from core.telemetry.events import EventHub
from core.trainer.process import child
from core.trainer.process.child_state import ChildState
from core.trainer.process.crossing import MAIN_NOT_GUARDED, Crossing
from core.trainer.process.handback import HandBack
from core.trainer.process.pipe import Inbox, Message
from core.trainer.process.postmortem import (
    last_good_checkpoint,
    main_not_guarded,
    why_it_ended,
)
from core.trainer.process.ranks import entry_point
from core.trainer.process.shared import Packed
from core.trainer.process.watch import ExitStatus, WatchedProcess, subreaper
from core.trainer.running.observers import Observers
from core.trainer.running.placement import escalate, kill_if_silent, until_released
from core.trainer.running.signals import STOP_SIGNALS
from core.trainer.running.starts import run_starts
from core.trainer.state.results import TrainingResults

__all__ = ("TrainingProcess", "start_method", "warm_up")

_EXIT_MARGIN_S = 15.0  # to exit, after the child reported how its run ended

# What the fork server imports once: the training process, its event loop's backend, and the
# launcher of ``devices=N`` ranks.
_PRELOAD = (
    child.__name__,
    "anyio._backends._asyncio",
    "psutil",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
    "torch.distributed.launcher.api",
)


def start_method() -> multiprocessing.context.ForkServerContext:
    """The fork server training processes start from: a single-threaded interpreter that
    imported torch and ``core`` once and never touched CUDA (as safe as ``spawn``)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(_PRELOAD))
    return context


def warm_up() -> None:
    """Start the fork server now (a worker thread's call; it imports in the background)."""
    start_method()
    multiprocessing.forkserver.ensure_running()


def _start(process: multiprocessing.process.BaseProcess, inbox: Inbox) -> None:
    """Start the training process, then the thread reading its records (a worker thread's call)."""
    process.start()
    inbox.start()


def _told(control: Connection, message: object) -> bool:
    """Send ``message`` down the control pipe; False where the child is gone."""
    try:
        control.send(message)
    except OSError:
        return False
    return True


class _Child:
    """A started training process as its supervisor reaches it: watched by its pidfd,
    heard through its inbox, told through its control pipe (``Stoppable``)."""

    def __init__(self, process: WatchedProcess, inbox: Inbox, control: Connection) -> None:
        self.process, self.inbox, self.control = process, inbox, control

    def ask_to_cancel(self) -> bool:
        return _told(self.control, "cancel")

    def silent_s(self) -> float:
        return time.monotonic() - self.inbox.last_heard

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        self.process.kill()


class TrainingProcess:
    """Runs one job's ``train()`` in a child process and relays it to this event loop."""

    running = 0  # this process's training processes being started or running

    def __init__(
        self,
        job_class: type,
        config: TrainingConfig,
        crossing: Crossing,
        *,
        model: nn.Module,
        hub: EventHub,
        observers: Observers,
        state: ChildState,
        on_open: Callable[[Path], None],
    ) -> None:
        self.job_class, self.config, self.crossing = job_class, config, crossing
        self.model, self.hub, self.observers, self.state = model, hub, observers, state
        self.on_open = on_open
        self.ended: Message | None = None
        self.eof = False
        self.signals: list[int] = []
        self.killed_why = ""
        self.packed: Packed | None = None
        self.control: Connection | None = None  # the pipe to the child while it runs
        self.held_stop: str | None = None  # the stop requested, sent once the pipe exists
        self.cancelled: anyio.Event | None = None  # set once this train() is cancelled

    @staticmethod
    def prepare(config: TrainingConfig) -> None:
        """Before the first run: start the fork server (a worker thread's call)."""
        warm_up()

    async def execute(self) -> TrainingResults:
        """Start the child, relay it to its end, and return or raise as it ended (cancelled:
        ``core.trainer.running.placement``)."""
        return await until_released(self._lifecycle)

    async def _lifecycle(self, cancelled: anyio.Event) -> TrainingResults | None:
        """One ``train()``, from nothing opened to everything released; None once ``cancelled``.
        Each resource goes to ``opened`` as it opens; the one ``finally`` releases them."""
        opened = contextlib.ExitStack()
        self.cancelled = cancelled
        TrainingProcess.running += 1  # before any await: jobs started together count together
        try:
            if cancelled.is_set():
                return None
            self.packed = packed = await anyio.to_thread.run_sync(
                self.crossing.pack, self.model, limiter=run_starts()
            )
            opened.callback(packed.release)  # last: once the child that maps it is gone
            if cancelled.is_set():
                return None  # cancelled before the start: the child is never started
            context = start_method()
            control_in, control_out = context.Pipe(duplex=False)
            records_in, records_out = context.Pipe(duplex=False)
            for end in (control_in, control_out, records_in, records_out):
                opened.callback(end.close)
            self._open_control(control_out)
            # Training processes at once share the service's threads: each spinning a full
            # OpenMP pool on the same cores, they slow one another down tenfold.
            threads = max(1, torch.get_num_threads() // TrainingProcess.running)
            process = context.Process(
                target=entry_point(self.config),
                name="core-training",
                args=(self.job_class, self.config, packed, control_in, records_out, threads),
            )
            inbox = Inbox(records_in)
            subreaper.acquire()  # before the start: a fork server that dies leaves its child here
            opened.callback(subreaper.release)
            # Run to its end even when cancelled meanwhile: the child then exists, and is told.
            await anyio.to_thread.run_sync(_start, process, inbox, limiter=run_starts())
            watched = WatchedProcess(process)
            opened.callback(watched.release)  # first: killed if still running, then let go
            self.state.pid = watched.pid
            control_in.close()  # the child's ends: end-of-file here once the child is gone
            records_out.close()
            child = _Child(watched, inbox, control_out)
            await self._relay_to_the_end(child, cancelled)
            status = await anyio.to_thread.run_sync(watched.exit_status)
            if cancelled.is_set():
                return None
            return await self._outcome(status)
        finally:
            self.control = None  # no stop request reaches a pipe being closed
            try:
                await anyio.to_thread.run_sync(opened.close)  # it may wait for the child
            finally:
                TrainingProcess.running -= 1

    def _open_control(self, control: Connection) -> None:
        """The pipe to the child exists: a stop requested meanwhile waits in it for the child."""
        self.control = control
        if self.held_stop is not None:
            _told(control, ("stop", self.held_stop))

    def request_stop(self, reason: str) -> bool:
        """The job's ``request_stop``: passed on, or held until the pipe to the child exists.
        False once the child has ended or this ``train()`` is being cancelled."""
        if self.ended is not None or self.eof:
            return False
        if self.cancelled is not None and self.cancelled.is_set():
            return False
        if self.held_stop is None:  # the first reason is the one the run keeps
            self.held_stop = str(reason)
            if self.control is not None:
                return _told(self.control, ("stop", self.held_stop))
        return True

    async def _relay_to_the_end(self, child: _Child, cancelled: anyio.Event) -> None:
        """Publish what the child sends until it has ended (stopping it once ``cancelled``),
        then wait for it to exit and let the callbacks see the last records."""
        self.hub.reopen()
        async with anyio.create_task_group() as watchers:
            self.observers.start(watchers, self.hub)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._stop_once, child, cancelled)
                    if self.config.run.handle_signals:
                        tg.start_soon(self._forward_signals, child)
                    await self._relay(child.inbox)
                    tg.cancel_scope.cancel()
            finally:
                await self._close(child)

    async def _stop_once(self, child: _Child, cancelled: anyio.Event) -> None:
        """This train() cancelled: the child is told to cancel, and killed once silent."""
        await cancelled.wait()
        self._dispatch(child.inbox)
        if self.ended is None and not self.eof:
            self.killed_why = await escalate(child, self.config.run.stop_grace_s)

    async def _relay(self, inbox: Inbox) -> None:
        """Publish what arrives until the child's ``ended`` message or its end-of-file."""
        while self.ended is None and not self.eof:
            await inbox.wait()
            self._dispatch(inbox)

    def _dispatch(self, inbox: Inbox) -> None:
        while inbox.messages:
            message = inbox.messages.popleft()
            if message[0] == "records":
                for record in message[1]:
                    self.state.read(record)
                    self.hub.publish(record)
                self.hub.wake_all()  # on the event loop's thread: consumers read them now
            elif message[0] == "opened":
                self.state.run_dir = Path(message[1])
                self.on_open(self.state.run_dir)
            elif message[0] == "ended":
                self.ended = message
            elif message[0] == "eof":
                self.eof = True

    async def _forward_signals(self, child: _Child) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            async with anyio.create_task_group() as deadline:
                with anyio.open_signal_receiver(*STOP_SIGNALS) as received:
                    async for signum in received:
                        self.signals.append(int(signum))
                        child.process.send(signum)
                        if len(self.signals) == 1:  # a frozen child is killed, as on a cancel
                            deadline.start_soon(self._kill_if_silent, child)
        finally:
            if self.signals:  # as in thread mode: the service is on its way out
                for stop_signal in STOP_SIGNALS:
                    signal.signal(stop_signal, signal.SIG_IGN)

    async def _kill_if_silent(self, child: _Child) -> None:
        self.killed_why = await kill_if_silent(child, self.config.run.stop_grace_s)

    async def _close(self, child: _Child) -> None:
        """Wait for the child to exit, then let the callbacks see the last records."""
        process = child.process
        if self.ended is None and not self.eof:  # only a failure of this relay leaves it so
            process.kill()
        if not await anyio.to_thread.run_sync(process.join, _EXIT_MARGIN_S):
            process.kill()
            await anyio.to_thread.run_sync(process.join)
        await self.observers.catch_up()
        self.hub.close()
        await self.observers.finish()

    async def _outcome(self, status: ExitStatus) -> TrainingResults:
        opened = self.state.run_dir is not None
        if self.ended is None and main_not_guarded(status, opened=opened):
            raise MainNotGuarded(MAIN_NOT_GUARDED)
        if self.ended is None:
            last, done = await anyio.to_thread.run_sync(
                last_good_checkpoint, self.config, self.state
            )
            self.state.last_checkpoint = last
            why = self.killed_why or why_it_ended(status, opened=opened)
            if done is not None:
                why += " while it handed the trained weights back"
            raise TrainingProcessDied(status.code, status.signal_name, last, why=why, finished=done)
        how, detail = self.ended[1], self.ended[2]
        if how == "failed":
            raise detail
        if how == "cancelled":  # the service's own cancellation propagates from _supervise
            raise TrainingProcessDied(status.code, None, detail, why=" after a cancel")
        results, final = detail
        self.state.best_checkpoint = results.best_checkpoint
        if final is None:  # in the shared memory the weights crossed in
            assert self.packed is not None
            await anyio.to_thread.run_sync(HandBack(self.packed).load_into, self.model)
        else:
            await anyio.to_thread.run_sync(load_weights, final, self.model)
            await anyio.to_thread.run_sync(child.discard_handed_back, final)
        assert isinstance(results, TrainingResults)
        return results

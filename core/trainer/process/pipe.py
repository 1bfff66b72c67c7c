"""The two one-way pipes between a service and its training process, and what goes through.

Child to parent, batched by a sender thread so neither event loop blocks: ``("records", [...])``,
``("opened", run_dir)``, ``("alive",)`` every second, and one ``("ended", how, detail)`` last
(``completed``, ``failed`` or ``cancelled``). Parent to child: ``("stop", reason)`` and
``"cancel"``. End-of-file means the other process is gone.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__ = ("Inbox", "Message", "Sender", "until_cancelled")

Message = tuple[Any, ...]
_DONE = ("__done__",)


def _picklable(message: Message) -> Message:
    """``message``, with an exception that does not pickle replaced by one that does."""
    if message[0] != "ended" or not isinstance(message[2], BaseException):
        return message
    try:
        pickle.dumps(message[2])
    except Exception:
        error = message[2]
        return (*message[:2], RuntimeError(f"{type(error).__name__}: {error}"))
    return message


def until_cancelled(control: Connection, on_stop: Callable[[str], object]) -> None:
    """Pass each ``("stop", reason)`` from the parent to ``on_stop``, until ``"cancel"`` or
    the parent's end-of-file."""
    with contextlib.suppress(EOFError, OSError):
        while (message := control.recv()) != "cancel":
            if isinstance(message, tuple) and message[0] == "stop":
                on_stop(message[1])


class Sender:
    """Sends messages from any thread of the training process, batched, never blocking the
    caller; :meth:`close` sends what is queued and waits for it."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._queue: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="core-pipe-sender", daemon=True)
        self._thread.start()

    def put(self, message: Message) -> None:
        self._queue.put(message)

    def close(self) -> None:
        self._queue.put(_DONE)
        self._thread.join()

    def _run(self) -> None:
        done = False
        while not done:
            batch, records = [], list[Any]()
            message = self._queue.get()
            while True:
                if message is _DONE:
                    done = True
                elif message[0] == "records":
                    records.extend(message[1])
                else:
                    if records:
                        batch.append(("records", records))
                        records = []
                    batch.append(_picklable(message))
                try:
                    message = self._queue.get_nowait()
                except queue.Empty:
                    break
            if records:
                batch.append(("records", records))
            if batch:
                try:
                    self._connection.send(batch)
                except OSError:  # the parent is gone: nobody is left to tell
                    return


class Inbox:
    """Reads every batch the training process sends into :attr:`messages`, on a thread of its
    own (a cancelled waiter never leaves a read half done), and wakes the event loop that
    created it; ``("eof",)`` ends the messages."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.messages: deque[Message] = deque()
        self.last_heard = time.monotonic()  # the child sends a heartbeat every second
        self._token = anyio.lowlevel.current_token()
        self._arrived = anyio.Event()
        self._thread = threading.Thread(target=self._read, name="core-pipe-reader", daemon=True)

    def start(self) -> None:
        """Start reading (a worker thread's call: a thread started from the event loop's thread
        blocks it until the new one holds the interpreter lock)."""
        self._thread.start()

    async def wait(self) -> None:
        """Until something arrived since the last wait (at once if it already has)."""
        await self._arrived.wait()
        self._arrived = anyio.Event()

    def _wake(self) -> None:
        self._arrived.set()

    def _read(self) -> None:
        while True:
            try:
                batch: list[Message] = self._connection.recv()
            except (EOFError, OSError, TypeError):
                # TypeError: closed under this thread (the caller left at a second Ctrl-C);
                # an end of file like the others, not a thread's traceback
                batch = [("eof",)]
            self.messages.extend(batch)
            self.last_heard = time.monotonic()
            try:
                anyio.from_thread.run_sync(self._wake, token=self._token)
            except RuntimeError:  # the event loop is gone: nobody is left to read
                return
            if batch[-1][0] == "eof":
                return

"""Fan-out of run records to async consumers that can never slow the step loop.

Publishing only appends to a bounded buffer per consumer (one that falls behind loses its
oldest records) and never touches the event loop; consumers poll theirs (asyncio and trio).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

__all__ = ("EventHub", "EventStream")

Record = dict[str, Any]


class EventStream:
    """An async iterator of records; ends after the run it watches ends."""

    def __init__(
        self,
        hub: EventHub,
        capacity: int,
        poll_interval_s: float,
        on_first_drop: Callable[[], None] | None = None,
    ) -> None:
        self._hub = hub
        self._on_first_drop = on_first_drop
        self._buffer: deque[Record] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._poll_interval_s = poll_interval_s
        self._closed = False
        self._waiting: tuple[anyio.Event, EventLoopToken, int] | None = None  # +thread
        self.dropped = 0  # records lost by falling more than capacity behind

    def offer(self, record: Record) -> None:
        """Called by the producer; drops the oldest record when the buffer is full."""
        with self._lock:
            full = len(self._buffer) == self._buffer.maxlen
            self.dropped += full
            self._buffer.append(record)
        if full and self.dropped == 1 and self._on_first_drop is not None:
            self._on_first_drop()  # on the producer's thread, as the drop happens

    @property
    def backlog(self) -> int:
        return len(self._buffer)

    def close(self) -> None:
        """No more records will come; iteration ends once the buffer is drained."""
        self._closed = True
        self.wake()

    def wake(self) -> None:
        """Wake the consumer if it waits (any thread; cheap when it does not)."""
        waiting = self._waiting
        if waiting is None:
            return
        event, token, thread = waiting
        if threading.get_ident() == thread:
            event.set()
            return
        with contextlib.suppress(Exception):  # the consumer's event loop may be gone
            anyio.from_thread.run_sync(event.set, token=token)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Record:
        while True:
            with self._lock:
                if self._buffer:
                    return self._buffer.popleft()
                if self._closed:
                    raise StopAsyncIteration
                event = anyio.Event()
                self._waiting = (event, anyio.lowlevel.current_token(), threading.get_ident())
            # Woken at once by close(), wake() or the run's wake_all() after each periodic drain
            # of its log (records never wake: publishing stays off the event loop); the poll is
            # a fallback costing one wake-up per poll_interval_s (and one take of the interpreter
            # lock the step thread launches kernels with), not fifty a second.
            try:
                with anyio.move_on_after(self._poll_interval_s):
                    await event.wait()
            finally:
                self._waiting = None

    async def aclose(self) -> None:
        self._hub.unsubscribe(self)
        self.close()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class EventHub:
    """Thread-safe publisher of records to any number of :class:`EventStream` subscribers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: list[EventStream] = []
        self._closed = False
        self.published = 0
        self.ended = False  # a run_end was published: the run's end is decided

    def reopen(self) -> None:
        with self._lock:
            self._closed = False
            self.ended = False

    def subscribe(
        self,
        capacity: int = 1024,
        poll_interval_s: float = 0.5,
        on_first_drop: Callable[[], None] | None = None,
    ) -> EventStream:
        """A stream of the records published from now on; ``on_first_drop`` runs on the
        publishing thread (it must not block) when it first loses a record."""
        stream = EventStream(self, capacity, poll_interval_s, on_first_drop)
        with self._lock:
            if self._closed:  # the run already ended: nothing will come
                stream.close()
            else:
                self._streams = [*self._streams, stream]
        return stream

    def unsubscribe(self, stream: EventStream) -> None:
        with self._lock:
            self._streams = [s for s in self._streams if s is not stream]

    def publish(self, record: Record) -> None:
        self.published += 1
        if record.get("event") == "run_end":
            self.ended = True
        for stream in self._streams:  # copy-on-write list: no lock needed to read it
            stream.offer(record)

    def wake_all(self) -> None:
        for stream in self._streams:
            if stream.backlog:
                stream.wake()

    @property
    def dropped(self) -> int:
        return sum(s.dropped for s in self._streams)

    def close(self) -> None:
        """End every current subscription (after its buffered records are read)."""
        with self._lock:
            streams, self._streams = self._streams, []
            self._closed = True
        for stream in streams:
            stream.close()

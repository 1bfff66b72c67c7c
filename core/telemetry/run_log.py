"""A run's directory and its structured event log (orjson, one JSON object per line).

``emit`` only queues (any thread); ``drain`` writes, from a worker thread every
``flush_interval_s`` and at epoch ends, checkpoints and the end.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import secrets
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson
import structlog

from core.telemetry.events import EventHub

__all__ = ("CurrentLog", "RunLog", "new_run_id", "record_before_the_run")

_MAX_QUEUED = 10_000  # emit drains itself past this (an event loop blocked by someone else)
_CHUNK = 64  # records rendered between two chances for other threads to run
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE
_Queued = tuple[str, str, float, dict[str, Any]]


# Never structlog.configure(): an application's own logging setup is left alone.
_process_log = structlog.get_logger("core")


def new_run_id() -> str:
    """A run id that sorts by start time (UTC, ms): ``20261122-031500.123-a1b2c3``."""
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}"
    return f"{stamp}-{secrets.token_hex(3)}"


@functools.lru_cache(maxsize=4)
def _iso_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def record_before_the_run(event: str, **fields: Any) -> dict[str, Any]:
    """An ``info`` record of a run not yet opened (``run_id`` empty), such as ``pending``."""
    common = {"event": event, "ts": _iso(time.time()), "level": "info", "run_id": "", "rank": 0}
    return common | fields


def _iso(ts: float) -> str:
    """``ts`` as ISO 8601 UTC to the microsecond (the second's text is cached)."""
    fraction, whole = math.modf(ts)  # as datetime.fromtimestamp rounds
    second, micro = int(whole), round(fraction * 1e6)
    if micro >= 1_000_000:
        second, micro = second + 1, micro - 1_000_000
    return f"{_iso_second(second)}.{micro:06d}Z"


class _GuardedFile:
    """The log file: a failing write degrades logging to the event stream, never the run."""

    def __init__(self, path: Path, on_failure: Callable[[str], None]) -> None:
        self.path = path
        self._file: IO[bytes] = path.open("ab")
        self._on_failure = on_failure
        self.failure: str | None = None

    def _fail(self, exc: OSError) -> None:
        if self.failure is None:
            self.failure = f"{type(exc).__name__}: {exc}"
            self._on_failure(self.failure)

    def write(self, data: bytes) -> None:
        if self.failure is None:
            try:
                self._file.write(data)
            except OSError as exc:
                self._fail(exc)

    def flush(self) -> None:
        if self.failure is None:
            try:
                self._file.flush()
            except OSError as exc:
                self._fail(exc)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # buffered bytes on a full disk: already reported
            self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed


class RunLog:
    """Opens the run directory and writes records to its JSONL file. A failing disk degrades
    it to ``events()`` only, with a ``log_degraded`` record; the run goes on."""

    def __init__(self, run_dir: Path, *, run_id: str, rank: int, hub: EventHub) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.rank = rank
        self._hub = hub
        run_dir.mkdir(parents=True, exist_ok=True)
        name = "events.jsonl" if rank == 0 else f"events.rank{rank}.jsonl"
        self.events_path = run_dir / name
        self._file = _GuardedFile(self.events_path, lambda why: self._degraded(name, why))
        self._queue: deque[_Queued] = deque()
        self._drain_lock = threading.Lock()
        self.wrote_a_step = False
        self.closed = False  # by close(): records emitted later go nowhere
        self.scratch: Path | None = None  # the temporary folder of a run not kept

    def _degraded(self, name: str, why: str) -> None:
        self._hub.publish(
            {
                "event": "log_degraded",
                "ts": _iso(time.time()),
                "level": "error",
                "run_id": self.run_id,
                "rank": self.rank,
                "file": str(self.run_dir / name),
                "reason": why,
                "effect": "records go to events() only; training and checkpoints go on",
            }
        )

    @classmethod
    def create(
        cls,
        log_dir: Path,
        experiment: str,
        run_id: str,
        *,
        rank: int,
        hub: EventHub,
        temporary: bool = False,
    ) -> RunLog:
        """The log of a run in ``<log_dir>/<experiment>/<run_id>``, or with ``temporary`` in
        a temporary folder that :meth:`discard` removes."""
        scratch = Path(tempfile.mkdtemp(prefix="core-smoke-")) if temporary else None
        root = log_dir if scratch is None else scratch
        log = cls(root / experiment / run_id, run_id=run_id, rank=rank, hub=hub)
        log.scratch = scratch
        return log

    @property
    def kept_dir(self) -> Path | None:
        return self.run_dir if self.scratch is None else None

    def discard(self) -> None:
        """Remove a temporary run directory (after :meth:`close`)."""
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def emit(self, event: str, **fields: Any) -> None:
        """Queue one ``info`` record (any thread; no I/O unless the queue is full)."""
        self._queue.append((event, "info", time.time(), fields))
        if len(self._queue) > _MAX_QUEUED:
            self.drain()

    def warning(self, event: str, **fields: Any) -> None:
        self._queue.append((event, "warning", time.time(), fields))

    def error(self, event: str, **fields: Any) -> None:
        self._queue.append((event, "error", time.time(), fields))

    @property
    def queued(self) -> bool:
        """Whether records wait for :meth:`drain` (any thread; a glance, no lock)."""
        return bool(self._queue)

    def drain(self) -> int:
        """Publish, write and flush every queued record, in order; return how many."""
        # orjson directly costs about 1 us a record; structlog's processor chain cost 4-5 us
        # and a flush per record.
        with self._drain_lock:
            if self._file.closed:
                return 0
            count, chunk = 0, list[bytes]()
            queue, publish, run_id, rank = self._queue, self._hub.publish, self.run_id, self.rank
            while queue:
                event, level, ts, fields = queue.popleft()
                # Name, time and level first, so a line reads well in a terminal.
                record = {
                    "event": event,
                    "ts": _iso(ts),
                    "level": level,
                    "run_id": run_id,
                    "rank": rank,
                    **fields,
                }
                publish(record)
                if event == "train_step":
                    self.wrote_a_step = True
                chunk.append(orjson.dumps(record, default=repr, option=_ORJSON_OPTIONS))
                count += 1
                if len(chunk) == _CHUNK:
                    self._file.write(b"".join(chunk))
                    chunk.clear()
                    time.sleep(0)  # let a waiting step thread take the interpreter lock
            if chunk:
                self._file.write(b"".join(chunk))
            self._file.flush()
            return count

    def wake_consumers(self) -> None:
        """Wake the ``events()`` consumers that have records waiting (after a drain)."""
        self._hub.wake_all()

    def write_json(self, name: str, payload: Any) -> Path | None:
        """Write ``payload`` as JSON next to the event log; None on a failing disk."""
        stem, suffix = name.rsplit(".", 1)
        target = self.run_dir / (name if self.rank == 0 else f"{stem}.rank{self.rank}.{suffix}")
        try:
            target.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        except OSError as exc:
            self._degraded(target.name, f"{type(exc).__name__}: {exc}")
            return None
        return target

    def close(self) -> None:
        """Drain what is queued, then close the file (idempotent)."""
        self.drain()
        with self._drain_lock:
            if not self._file.closed:
                self._file.close()
            self.closed = True


class CurrentLog:
    """Where a job's parts write records: the log of the run in progress. Warnings and
    errors when no log is open go to the process's structlog logger."""

    def __init__(self) -> None:
        self.log: RunLog | None = None

    def _open(self) -> RunLog | None:
        return None if self.log is None or self.log.closed else self.log

    def emit(self, event: str, **fields: Any) -> None:
        log = self.log  # every train_step record passes here: no call that is not needed
        if log is not None and not log.closed:
            log.emit(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        if (log := self._open()) is not None:
            log.warning(event, **fields)
        else:
            _process_log.warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        if (log := self._open()) is not None:
            log.error(event, **fields)
        else:
            _process_log.error(event, **fields)

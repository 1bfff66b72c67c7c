"""A run's directory and its structured event log (structlog + orjson, one JSON per line).

``logs/<experiment>/<run_id>/`` holds ``events.jsonl`` (rank 0; rank N > 0 writes
``events.rank<N>.jsonl``), ``config.json`` and ``amp_stats.json``. Every record carries
``event``, ``ts`` (ISO 8601, UTC, taken when the record was emitted), ``level``, ``run_id``
and ``rank``. The same records go to the :class:`~core.telemetry.events.EventHub`, so
``optimizer.events()`` sees exactly what the log gets, in the same order.

``emit`` is cheap and safe from any thread: it stamps the time and appends the fields to a
queue. ``drain`` renders the queued records through structlog (orjson renderer), writes
them and flushes; the orchestrator drains from the event loop every 50 ms, at every epoch
end, before every checkpoint and at the end of the run, so the step thread does no I/O and
no JSON work. If records pile up (an event loop blocked by someone else), ``emit`` drains
itself rather than grow without bound.

Each run gets its own structlog logger over its own file: ``core`` never calls
``structlog.configure()``, so an application's own logging setup is left alone.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, MutableMapping
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import orjson
import structlog

from core.telemetry.events import EventHub

__all__ = ("CurrentLog", "RunLog", "new_run_id")

_MAX_QUEUED = 10_000
_Queued = tuple[str, str, float, dict[str, Any]]


_process_log = structlog.get_logger("core")


def new_run_id() -> str:
    """A run id that sorts by start time (UTC, to the millisecond) and does not collide,
    such as ``20261122-031500.123-a1b2c3``."""
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}"
    return f"{stamp}-{secrets.token_hex(3)}"


def _orjson_dumps(obj: Any, default: Any = None) -> bytes:
    return orjson.dumps(obj, default=default, option=orjson.OPT_NON_STR_KEYS)


def _json_default(value: Any) -> Any:
    return str(value)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _GuardedFile:
    """The log file as structlog writes to it: a failing write (a full or read-only disk)
    degrades logging to the event stream only, and never reaches the run."""

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
    """Opens the run directory and writes records to its JSONL file.

    Logging never stops a run: if the disk under the log fails (full, read-only), the
    records keep flowing to ``events()``, a ``log_degraded`` error record says which file
    failed and why, and checkpoints are written as usual."""

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

        def publish(_: Any, level: str, event_dict: MutableMapping[str, Any]) -> Any:
            # Name, time and level first, so a line reads well in a terminal.
            record = {
                "event": event_dict.pop("event"),
                "ts": _iso(event_dict.pop("_ts")),
                "level": level,
                **event_dict,
            }
            hub.publish(record)
            return record

        self._log = structlog.wrap_logger(
            structlog.BytesLogger(self._file),  # type: ignore[arg-type]  # write/flush suffice
            processors=[publish, structlog.processors.JSONRenderer(serializer=_orjson_dumps)],
            wrapper_class=structlog.make_filtering_bound_logger(0),
            context_class=dict,
            cache_logger_on_first_use=True,
        ).bind(run_id=run_id, rank=rank)

    def _degraded(self, name: str, why: str) -> None:
        """Tell ``events()`` (the file cannot be told) that a log file stopped being written."""
        self._hub.publish({
            "event": "log_degraded", "ts": _iso(time.time()), "level": "error",
            "run_id": self.run_id, "rank": self.rank, "file": str(self.run_dir / name),
            "reason": why, "effect": "records go to events() only; training and checkpoints "
            "go on",
        })  # fmt: skip

    @classmethod
    def create(
        cls, log_dir: Path, experiment: str, run_id: str, *, rank: int, hub: EventHub
    ) -> RunLog:
        return cls(log_dir / experiment / run_id, run_id=run_id, rank=rank, hub=hub)

    def emit(self, event: str, **fields: Any) -> None:
        """Queue one ``info`` record (any thread; no I/O unless the queue is full)."""
        self._queue.append((event, "info", time.time(), fields))
        if len(self._queue) > _MAX_QUEUED:
            self.drain()

    def warning(self, event: str, **fields: Any) -> None:
        self._queue.append((event, "warning", time.time(), fields))

    def error(self, event: str, **fields: Any) -> None:
        self._queue.append((event, "error", time.time(), fields))

    def drain(self) -> int:
        """Render, write and flush every queued record, in order; return how many."""
        with self._drain_lock:
            if self._file.closed:
                return 0
            count = 0
            while self._queue:
                event, level, ts, fields = self._queue.popleft()
                getattr(self._log, level)(event, _ts=ts, **fields)
                count += 1
            return count

    def write_json(self, name: str, payload: Any) -> Path | None:
        """Write ``payload`` as pretty JSON next to the event log (rank 0's name kept); on a
        failing disk, say so in a ``log_degraded`` record and return None."""
        stem, suffix = name.rsplit(".", 1)
        target = self.run_dir / (name if self.rank == 0 else f"{stem}.rank{self.rank}.{suffix}")
        try:
            target.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
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

    @property
    def closed(self) -> bool:
        return self._file.closed


class CurrentLog:
    """Where a job's parts write records: the log of the run in progress. Warnings and
    errors that come when no run's log is open (a callback failing on ``run_end``) go to
    the process's structlog logger instead, so that none is lost."""

    def __init__(self) -> None:
        self.log: RunLog | None = None

    def _open(self) -> RunLog | None:
        return None if self.log is None or self.log.closed else self.log

    def emit(self, event: str, **fields: Any) -> None:
        if (log := self._open()) is not None:
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

"""A run's directory and its structured event log (structlog + orjson, one JSON per line).

``logs/<experiment>/<run_id>/`` holds ``events.jsonl`` (rank 0; rank N > 0 writes
``events.rank<N>.jsonl``), ``config.json`` and ``amp_stats.json``. Every record carries
``event``, ``level``, ``ts`` (ISO 8601, UTC), ``run_id`` and ``rank``. The same records go
to the :class:`~core.events.EventHub`, so ``optimizer.events()`` sees exactly what the log
gets.

Each run gets its own structlog logger over its own file: ``core`` never calls
``structlog.configure()``, so an application's own logging setup is left alone. Writes are
flushed per record (a killed process keeps every line it logged) and are thread-safe.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any

import orjson
import structlog

from core.events import EventHub

__all__ = ("RunLog", "new_run_id")


def new_run_id() -> str:
    """A sortable, collision-resistant run id such as ``20261122-031500-a1b2c3``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def _orjson_dumps(obj: Any, default: Any = None) -> bytes:
    return orjson.dumps(obj, default=default, option=orjson.OPT_NON_STR_KEYS)


def _json_default(value: Any) -> Any:
    return str(value)


class RunLog:
    """Opens the run directory and writes records to its JSONL file."""

    def __init__(self, run_dir: Path, *, run_id: str, rank: int, hub: EventHub) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.rank = rank
        run_dir.mkdir(parents=True, exist_ok=True)
        name = "events.jsonl" if rank == 0 else f"events.rank{rank}.jsonl"
        self.events_path = run_dir / name
        self._file: IO[bytes] = self.events_path.open("ab")
        self._hub = hub

        def publish(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
            # Name, time and level first, so a line reads well in a terminal.
            record = {
                "event": event_dict.pop("event"),
                "ts": event_dict.pop("ts"),
                "level": event_dict.pop("level"),
                **event_dict,
            }
            hub.publish(record)
            return record

        self._log = structlog.wrap_logger(
            structlog.BytesLogger(self._file),
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
                publish,
                structlog.processors.JSONRenderer(serializer=_orjson_dumps),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(0),
            context_class=dict,
            cache_logger_on_first_use=True,
        ).bind(run_id=run_id, rank=rank)

    @classmethod
    def create(
        cls, log_dir: Path, experiment: str, run_id: str, *, rank: int, hub: EventHub
    ) -> RunLog:
        return cls(log_dir / experiment / run_id, run_id=run_id, rank=rank, hub=hub)

    def emit(self, event: str, **fields: Any) -> None:
        """Write one ``info`` record (thread-safe)."""
        self._log.info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log.warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log.error(event, **fields)

    def write_json(self, name: str, payload: Any) -> Path:
        """Write ``payload`` as pretty JSON next to the event log (rank 0's name kept)."""
        stem, suffix = name.rsplit(".", 1)
        target = self.run_dir / (name if self.rank == 0 else f"{stem}.rank{self.rank}.{suffix}")
        target.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
        return target

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed

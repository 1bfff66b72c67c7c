"""Read a run's ``events.jsonl`` back into records, and pick series out of them. Every helper
tolerates odd content: a field absent, null, not a number or not finite is skipped."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

__all__ = (
    "Record",
    "Records",
    "first",
    "last",
    "mapping",
    "number",
    "numbers",
    "of",
    "read_events",
    "run_id",
    "series",
    "text",
    "timestamp",
)

Record = Mapping[str, Any]
Records = Sequence[Record]


def read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a run log, in file order; other lines (a crashed run's truncated
    last line) are skipped. Raises ``FileNotFoundError`` when ``path`` does not exist."""
    records: list[dict[str, Any]] = []
    for line in Path(path).read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records


def of(records: Iterable[Record], *events: str) -> list[Record]:
    """The records whose ``event`` is one of ``events``, in order."""
    return [r for r in records if r.get("event") in events]


def first(records: Iterable[Record], event: str) -> Record | None:
    """The first record named ``event``, or None."""
    return next((r for r in records if r.get("event") == event), None)


def last(records: Records, event: str) -> Record | None:
    """The last record named ``event``, or None."""
    return next((r for r in reversed(records) if r.get("event") == event), None)


def number(value: object) -> float | None:
    """``value`` as a finite float; None for null, bools, text and NaN/inf."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    result = float(value)
    return result if math.isfinite(result) else None


def numbers(records: Iterable[Record], event: str, field: str) -> list[float]:
    """The finite values of ``field`` over the records named ``event``."""
    values = (number(r.get(field)) for r in records if r.get("event") == event)
    return [v for v in values if v is not None]


def series(
    records: Iterable[Record], event: str, field: str, x: str = "step"
) -> tuple[list[float], list[float]]:
    """``(xs, ys)``: ``field`` against ``x`` over the records named ``event``, keeping only
    the records where both are finite numbers."""
    xs: list[float] = []
    ys: list[float] = []
    for r in records:
        if r.get("event") != event:
            continue
        xv, yv = number(r.get(x)), number(r.get(field))
        if xv is not None and yv is not None:
            xs.append(xv)
            ys.append(yv)
    return xs, ys


def mapping(value: object, *keys: str) -> Mapping[str, Any]:
    """The nested mapping ``value[keys[0]][keys[1]]...``; empty where a level is absent."""
    current: object = value
    for key in keys:
        current = current.get(key) if isinstance(current, Mapping) else None
    return current if isinstance(current, Mapping) else {}


def text(value: object, default: str = "?") -> str:
    """``value`` as display text: ``default`` for null or empty."""
    if value is None or value == "":
        return default
    return str(value)


def run_id(records: Records) -> str:
    """The run's id from ``run_start`` (or any record)."""
    start = first(records, "run_start") or {}
    return text(start.get("run_id") or next((r.get("run_id") for r in records), None))


def timestamp(record: Record) -> float | None:
    """The record's ``ts`` as POSIX seconds; None when absent or malformed."""
    ts = record.get("ts")
    if not isinstance(ts, str):
        return None
    try:
        # Python 3.10's fromisoformat does not read "Z"
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None

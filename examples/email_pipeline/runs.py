"""One retraining run as the service sees it: its records (replayable), status and outcome.

The records are those of ``run.events()``, kept in order, so ``GET /runs/{id}/events`` can
replay a run from its ``run_start`` to its ``run_end`` whenever a client connects, and
follow it live while it trains.

Example::

    async for record in handle.follow():    # ends after run_end
        ...
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

__all__ = ("RunHandle",)


class RunHandle:
    """A run's id, status, records and swap decision; the task that runs it.

    ``status`` is ``starting`` (features being built), ``running`` (from ``run_start``),
    then the ``run_end`` status (``completed``, ``stopped``, ``cancelled``, ``failed``,
    ``abandoned``). ``finished`` is set once the swap is decided or the run has ended
    otherwise.

    >>> handle = RunHandle(1)
    >>> handle.status, handle.run_id
    ('starting', None)
    """

    def __init__(self, number: int) -> None:
        self.number = number
        self.run_id: str | None = None
        self.status = "starting"
        self.records: list[dict[str, Any]] = []
        self.trained_on: dict[str, int] = {}
        self.decision: dict[str, Any] | None = None
        self.error: str | None = None
        self.last_checkpoint: str | None = None
        self.global_step: int | None = None
        self.elapsed_s: float | None = None
        self.task: asyncio.Task[None] | None = None
        self.started = asyncio.Event()
        """Set at ``run_start`` (``run_id`` known), or when the run ended before it."""
        self.finished = asyncio.Event()
        self._changed = asyncio.Event()

    def add(self, record: dict[str, Any]) -> None:
        """Keep one record of the run and wake the streams that follow it."""
        self.records.append(record)
        if record["event"] == "run_start":
            self.run_id, self.status = str(record["run_id"]), "running"
            self.started.set()
        elif record["event"] == "run_end":
            self.status = str(record["status"])
            self.last_checkpoint = record.get("last_checkpoint")
            self.error = record.get("error")
            self.global_step, self.elapsed_s = record["global_step"], record["elapsed_s"]
        self._wake()

    def finish(self, status: str, error: str | None = None) -> None:
        """The run is over (``status`` unless ``run_end`` already said how it ended)."""
        if not any(record["event"] == "run_end" for record in self.records):
            self.status = status
        self.error = self.error or error
        self.started.set()
        self.finished.set()
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def follow(self) -> AsyncIterator[dict[str, Any]]:
        """Every record from the first, then each new one as it comes; ends after
        ``run_end`` (or when the run ends without one)."""
        sent = 0
        while True:
            changed = self._changed
            while sent < len(self.records):
                record = self.records[sent]
                sent += 1
                yield record
                if record["event"] == "run_end":
                    return
            if self.finished.is_set():
                return
            await changed.wait()

    def describe(self) -> dict[str, Any]:
        """What ``GET /runs/{id}``, ``POST /retrain`` and ``DELETE /runs/{id}`` answer."""
        return {
            "run_id": self.run_id,
            "number": self.number,
            "status": self.status,
            "finished": self.finished.is_set(),
            "records": len(self.records),
            "trained_on": self.trained_on,
            "decision": self.decision,
            "error": self.error,
            "last_checkpoint": self.last_checkpoint,
            "global_step": self.global_step,
            "elapsed_s": self.elapsed_s,
        }

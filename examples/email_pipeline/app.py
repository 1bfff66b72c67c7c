"""The HTTP face of the pipeline: a FastAPI app that ingests, scores, retrains and streams.

=========================  ====================================================================
``GET /health``            liveness, counts, the served version, the run in flight
``POST /events``           a JSON list of events (``store.Event``: recipient, campaign, kind,
                           t; 422 on bad input); may start a retraining
``GET /score/{recipient}`` P(convert) from the served model (404 unknown, 503 before a model)
``GET /model``             the served version, its run, checkpoint and held-out metrics
``POST /retrain``          start a run now: 202 with its id; 409 while one is in flight (no
                           queue: the caller decides whether to wait, cancel or give up)
``GET /runs``              the recent runs
``GET /runs/{id}``         one run: status, records so far, swap decision
``GET /runs/{id}/events``  Server-Sent Events: one ``data: <json>`` per record, to ``run_end``
``DELETE /runs/{id}``      cancel the run (a clean stop); answers with how it ended
=========================  ====================================================================

Scoring runs on the event loop with the served CPU copy (a millisecond for this model);
training runs in the run's step thread, so requests keep being answered while it trains.

Example::

    app = create_app(RetrainSettings(log_dir="logs", retrain_every=2_000))
    uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import orjson
from fastapi import Body, Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import StreamingResponse

from examples.email_pipeline.retrainer import Busy, NotEnoughData, Retrainer, RetrainSettings
from examples.email_pipeline.runs import RunHandle
from examples.email_pipeline.scoring import conversion_probability
from examples.email_pipeline.store import EXAMPLE_EVENT, Event, EventStore

__all__ = ("MAX_EVENTS_PER_POST", "create_app")

#: The most events one ``POST /events`` may carry (more: 422).
MAX_EVENTS_PER_POST = 50_000

EventList = Annotated[
    list[Event],
    Body(
        max_length=MAX_EVENTS_PER_POST,
        examples=[[EXAMPLE_EVENT]],
        description="A JSON list of events (see the Event schema: recipient, campaign, kind, t).",
    ),
]


def _run_of(run_id: str, request: Request) -> RunHandle:
    """The run named in the path (404 if unknown or forgotten)."""
    runs: dict[str, RunHandle] = request.app.state.retrainer.runs
    handle = runs.get(run_id)
    if handle is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no run {run_id!r}; recent runs: {list(runs)[-5:]}"
        )
    return handle


Run = Annotated[RunHandle, Depends(_run_of)]


def create_app(settings: RetrainSettings | None = None) -> FastAPI:
    """A new service (its own store and retrainer) retraining with ``settings``. Leaving its
    lifespan cancels the run in flight, which keeps its stop checkpoint.

    >>> app = create_app(RetrainSettings(log_dir="logs", retrain_every=None))
    >>> app.state.retrainer.served is None
    True
    """
    store = EventStore()
    retrainer = Retrainer(store, settings or RetrainSettings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await retrainer.aclose()

    app = FastAPI(title="email pipeline", lifespan=lifespan)
    app.state.store, app.state.retrainer = store, retrainer

    @app.get("/health")
    async def health() -> dict[str, Any]:
        current, served = retrainer.current, retrainer.served
        return {
            "status": "ok",
            "events": store.total,
            "recipients": len(store),
            "model_version": None if served is None else served.version,
            "training": None if current is None else (current.run_id or "starting"),
        }

    @app.post("/events", status_code=status.HTTP_202_ACCEPTED)
    async def ingest(events: EventList) -> dict[str, Any]:
        """Store campaign events: each ``{"recipient", "campaign", "kind", "t"}`` with
        ``kind`` one of ``sent``, ``open``, ``click``, ``convert`` and ``t`` in Unix seconds.
        A bad event refuses the whole list (422, naming the event's index and field)."""
        added = store.add(events)
        started = retrainer.ingested(added)
        return {"accepted": added, "events": store.total, "retraining_started": started}

    @app.get("/score/{recipient}")
    async def score(recipient: str) -> dict[str, Any]:
        if recipient not in store:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND, f"unknown recipient {recipient!r}: POST its events first"
            )
        served = retrainer.served  # one version for the whole request
        if served is None:
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                "no model yet: POST /retrain once events are in",
            )
        probability = conversion_probability(served.model, store.features(recipient))
        return {"recipient": recipient, "probability": probability, "model_version": served.version}

    @app.get("/model")
    async def model() -> dict[str, Any]:
        served = retrainer.served
        if served is None:
            return {
                "version": 0,
                "run_id": None,
                "checkpoint": None,
                "metrics": None,
                "trained_on": None,
            }
        return served.describe()

    @app.post("/retrain", status_code=status.HTTP_202_ACCEPTED)
    async def retrain() -> dict[str, Any]:
        try:
            handle = retrainer.start()
        except Busy as busy:
            raise HTTPException(status.HTTP_409_CONFLICT, str(busy)) from None
        except NotEnoughData as short:
            raise HTTPException(status.HTTP_409_CONFLICT, str(short)) from None
        await handle.started.wait()  # the run's id comes with its run_start record
        if handle.run_id is None:
            raise HTTPException(
                status.HTTP_500_INTERNAL_SERVER_ERROR,
                f"the run failed before it started: {handle.error}",
            )
        return handle.describe()

    @app.get("/runs")
    async def runs() -> list[dict[str, Any]]:
        return [handle.describe() for handle in retrainer.runs.values()]

    @app.get("/runs/{run_id}")
    async def run(handle: Run) -> dict[str, Any]:
        return handle.describe()

    @app.get("/runs/{run_id}/events")
    async def run_events(handle: Run) -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            async for record in handle.follow():
                yield b"data: " + orjson.dumps(record, default=str) + b"\n\n"

        headers = {"Cache-Control": "no-cache"}
        return StreamingResponse(lines(), media_type="text/event-stream", headers=headers)

    @app.delete("/runs/{run_id}")
    async def cancel(handle: Run) -> dict[str, Any]:
        await retrainer.cancel(handle)
        served = retrainer.served
        return handle.describe() | {"serving_version": None if served is None else served.version}

    return app

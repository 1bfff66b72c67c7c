"""An asyncio service that keeps serving while it retrains: ingest, score, retrain, hot-swap.

``python -m examples.email_pipeline --port 8000 --simulate`` runs it; see ``app`` for the
endpoints and ``retrainer`` for how a run is started, followed, cancelled and swapped in.
"""

from __future__ import annotations

from examples.email_pipeline.app import create_app
from examples.email_pipeline.retrainer import Busy, NotEnoughData, Retrainer, RetrainSettings
from examples.email_pipeline.scoring import build_model, conversion_probability, load_served
from examples.email_pipeline.serve import serving
from examples.email_pipeline.simulator import synthetic_events
from examples.email_pipeline.store import Event, EventStore, featurize

__all__ = (
    "Busy",
    "Event",
    "EventStore",
    "NotEnoughData",
    "RetrainSettings",
    "Retrainer",
    "build_model",
    "conversion_probability",
    "create_app",
    "featurize",
    "load_served",
    "serving",
    "synthetic_events",
)

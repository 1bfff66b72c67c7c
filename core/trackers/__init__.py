"""Experiment trackers: callbacks that send a run's params, scalars and reports to a backend.

``CSVLogger`` (stdlib only), ``TensorBoardLogger``, ``MLflowLogger`` and ``WandbLogger`` (the
``trackers`` extra) share :class:`Tracker`, the base a new tracker subclasses.

Example::

    from core.trackers import CSVLogger, TensorBoardLogger

    run = TrainingJob(
        config, model=model, train_loader=train, val_loader=val,
        callbacks=[CSVLogger(), TensorBoardLogger("runs")],
    )
"""

from __future__ import annotations

from core.trackers.base import Tracker, TrackerUnavailableError
from core.trackers.csv import CSVLogger
from core.trackers.mlflow import MLflowLogger
from core.trackers.tensorboard import TensorBoardLogger
from core.trackers.wandb import WandbLogger

__all__ = (
    "CSVLogger",
    "MLflowLogger",
    "TensorBoardLogger",
    "Tracker",
    "TrackerUnavailableError",
    "WandbLogger",
)

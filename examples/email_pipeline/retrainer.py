"""Background retraining with ``await run.train()``, and the hot swap of the served model.

One run at a time. A run snapshots the event store, builds features in a worker thread,
trains a fresh model with :class:`core.OptimizedTrainingOptimizer` in a child process
(``isolation="process"``: the service's interpreter only relays the run's records, so
``/score`` keeps its latency) or on a Ray cluster (``ray_address``), then loads the run's
best checkpoint into a CPU copy and scores it and the served model on the same held-out
recipients. The copy replaces the served model (one reference assignment on the event
loop: atomic for every request) only when its validation log loss is lower. Cancelling a
run stops it at a step boundary; its stop checkpoint stays loadable and the served model
is untouched.

Each retrain checkpoints into a directory of its own; only the newest ``keep_retrains`` of
them, and the one the served model came from, stay on disk (see ``retention``).

Example::

    retrainer = Retrainer(store, RetrainSettings(log_dir="logs"))
    handle = retrainer.start()          # Busy if a run is in flight
    await handle.started.wait()         # handle.run_id is the run's id
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog
from torch.utils.data import DataLoader

from core import (
    CheckpointConfig,
    EventStream,
    LoggingConfig,
    OptimConfig,
    OptimizedTrainingOptimizer,
    RayConfig,
    RunConfig,
    TrainingConfig,
)
from core.errors import config_error
from examples.email_pipeline.retention import Retention
from examples.email_pipeline.runs import RunHandle
from examples.email_pipeline.scoring import ServedModel, build_model, evaluate, load_served
from examples.email_pipeline.store import EventStore, Split, build_split

__all__ = ("Busy", "NotEnoughData", "RetrainSettings", "Retrainer")

log = structlog.get_logger()


class Busy(RuntimeError):
    """Raised by :meth:`Retrainer.start` while a run is in flight (``POST /retrain``: 409)."""

    def __init__(self, handle: RunHandle) -> None:
        run = handle.run_id
        super().__init__(
            "a run is starting; try again once it has started (GET /health names it)"
            if run is None
            else f"run {run} is in flight: wait for it (GET /runs/{run}) or cancel it "
            f"(DELETE /runs/{run}); one run at a time, requests are not queued"
        )
        self.handle = handle


class NotEnoughData(RuntimeError):
    """Raised by :meth:`Retrainer.start` when a split has too few recipients to train on."""


@dataclass(frozen=True, kw_only=True)
class RetrainSettings:
    """How the service retrains: where runs write, how often (``retrain_every`` new events;
    None: only on ``POST /retrain``), and the run's settings.

    >>> RetrainSettings(log_dir="logs", retrain_every=5_000).max_epochs
    3
    """

    log_dir: str | Path = "logs"
    experiment_name: str = "email_pipeline"
    retrain_every: int | None = 2_000
    max_epochs: int = 3
    batch_size: int = 64
    learning_rate: float = 3e-3
    seed: int = 0
    min_recipients: int = 10
    keep_runs: int = 50
    keep_retrains: int = 2
    """Retrains whose checkpoints stay on disk (the newest; the served model's stays too)."""
    isolation: Literal["thread", "process"] = "process"
    """Where runs train: a child process (the default: ``/score`` never waits on training
    for the interpreter lock) or a thread of the service (no process start, ~3 s here)."""
    ray_address: str | None = None
    """Retrain on a Ray cluster instead (``isolation="ray"``, whatever ``isolation`` says):
    its address (``"auto"``, ``"10.0.0.5:6379"``: this machine is a node of it), or ``"local"``
    for the one ``RAY_ADDRESS`` names, one running on this machine, or one started here.
    ``log_dir`` must then be storage every node mounts at the same absolute path."""

    def __post_init__(self) -> None:
        if self.retrain_every is not None and not self.retrain_every >= 1:
            raise config_error(
                "retrain_every",
                self.retrain_every,
                "None or an integer >= 1",
                "e.g. retrain_every=2000 (new events between runs).",
            )
        for name in ("max_epochs", "batch_size", "min_recipients", "keep_runs", "keep_retrains"):
            if not getattr(self, name) >= 1:
                raise config_error(name, getattr(self, name), "an integer >= 1")
        if self.ray_address is not None and not (
            isinstance(self.ray_address, str) and self.ray_address
        ):
            raise config_error(
                "ray_address",
                self.ray_address,
                "None, 'local' or a Ray cluster address",
                "e.g. ray_address='auto'.",
            )

    def training_config(self, checkpoint_dir: Path | None = None) -> TrainingConfig:
        """The run's config tree: the best checkpoint (by val_loss) is kept for the swap, in
        ``checkpoint_dir`` (None: the experiment's shared directory); on the Ray cluster
        ``ray_address`` names, if set."""
        on_cluster = self.ray_address is not None
        address = None if self.ray_address == "local" else self.ray_address
        return TrainingConfig(
            run=RunConfig(
                experiment_name=self.experiment_name,
                max_epochs=self.max_epochs,
                seed=self.seed,
                log_dir=self.log_dir,
                isolation="ray" if on_cluster else self.isolation,
            ),
            ray=RayConfig(address=address),
            optim=OptimConfig(learning_rate=self.learning_rate, max_grad_norm=1.0),
            checkpoint=CheckpointConfig(
                save_best=True, monitor="val_loss", keep_last_n=1, checkpoint_dir=checkpoint_dir
            ),
            logging=LoggingConfig(progress=False, reports=False),
        )


class Retrainer:
    """Starts, tracks and cancels the service's training runs, and holds the served model.

    >>> retrainer = Retrainer(EventStore(), RetrainSettings(retrain_every=None))
    >>> retrainer.served is None
    True
    """

    def __init__(self, store: EventStore, settings: RetrainSettings) -> None:
        self.store = store
        self.settings = settings
        self.served: ServedModel | None = None
        """The model ``GET /score`` uses; replaced as a whole, never changed in place."""
        self.current: RunHandle | None = None
        self.runs: OrderedDict[str, RunHandle] = OrderedDict()
        self._new_events = 0
        self._numbers = itertools.count(1)
        self.retention = Retention(
            Path(settings.log_dir) / settings.experiment_name / "checkpoints",
            settings.keep_retrains,
        )
        """The retrains' checkpoint directories, pruned before and after each retrain."""
        self._closing = False

    def ingested(self, count: int) -> bool:
        """Count ``count`` new events; start a run when ``retrain_every`` have arrived since
        the last one started and none is in flight. Returns whether one started."""
        self._new_events += count
        every = self.settings.retrain_every
        if every is None or self._new_events < every or self.current is not None:
            return False
        try:
            self.start()
        except NotEnoughData:
            return False
        return True

    def start(self) -> RunHandle:
        """Start a run on the events stored now (:class:`Busy`, :class:`NotEnoughData`)."""
        if self.current is not None:
            raise Busy(self.current)
        train, val = self.store.labelled_counts()
        needed = self.settings.min_recipients
        if min(train, val) < needed:
            raise NotEnoughData(
                f"{train} training and {val} validation recipients have a sent email; "
                f"retraining needs {needed} of each. Fix: POST more events first."
            )
        self._new_events = 0
        handle = RunHandle(next(self._numbers))
        handle.task = asyncio.create_task(self._execute(handle, self.store.snapshot()))
        self.current = handle
        return handle

    async def cancel(self, handle: RunHandle) -> None:
        """Cancel ``handle``'s run (a clean stop at a step boundary) and wait for its end."""
        if handle.task is not None and not handle.task.done():
            handle.task.cancel()
            await asyncio.wait([handle.task])

    async def aclose(self) -> None:
        """Stop for good: cancel the run in flight, start no other."""
        self._closing = True
        if self.current is not None:
            await self.cancel(self.current)

    async def _execute(self, handle: RunHandle, snapshot: dict[str, Any]) -> None:
        try:
            split = await asyncio.to_thread(build_split, snapshot)
            handle.trained_on = split.describe()
            await self._train_and_decide(handle, split)
        except asyncio.CancelledError:
            if handle.decision is None and handle.status == "completed":
                handle.decision = {"swapped": False, "reason": "cancelled before the swap"}
            handle.finish("cancelled")
            log.info("retrain_cancelled", run_id=handle.run_id, checkpoint=handle.last_checkpoint)
            raise
        except Exception as exc:  # a failed run is reported on its handle; serving goes on
            handle.finish("failed", error=f"{type(exc).__name__}: {exc}")
            log.error("retrain_failed", run_id=handle.run_id, error=handle.error)
        else:
            handle.finish(handle.status)
        finally:
            self.current = None
            if not self._closing:
                self.ingested(0)  # enough events arrived meanwhile: go again

    async def _train_and_decide(self, handle: RunHandle, split: Split) -> None:
        settings = self.settings
        directory = self.retention.new_retrain(handle.number)
        await self._prune()  # the retrains a cancelled or failed one left behind
        run = OptimizedTrainingOptimizer(
            settings.training_config(directory),
            model=build_model(settings.seed),
            train_loader=DataLoader(split.train, batch_size=settings.batch_size, shuffle=True),
            val_loader=DataLoader(split.val, batch_size=512),
        )
        stream = run.events()  # subscribed before train(): sees run_start
        pump = asyncio.create_task(self._pump(handle, stream))
        try:
            async with run:  # parts built in a worker thread, released on exit
                results = await run.train()
        finally:
            await stream.aclose()  # ends the pump once the records in hand are taken
            await asyncio.wait([pump])
        self.retention.ran_in(directory, results.run_dir)
        checkpoint = results.best_checkpoint or results.last_checkpoint
        if checkpoint is None:
            raise RuntimeError("the run wrote no checkpoint to serve from")
        candidate = await asyncio.to_thread(load_served, checkpoint, settings.seed)
        served = self.served
        new, old = await asyncio.to_thread(_compare, candidate, served, split)
        swapped = served is None or new["val_loss"] < old["val_loss"]
        if served is None or swapped:
            served = ServedModel(
                version=1 if served is None else served.version + 1,
                model=candidate,
                run_id=handle.run_id or "",
                checkpoint=checkpoint,
                metrics=new,
                trained_on=handle.trained_on,
            )
            self.served = served  # the swap: requests see the old model or the new, whole
        handle.decision = {
            "swapped": swapped,
            "candidate": new,
            "served": old or None,
            "serving_version": served.version,
        }
        log.info("retrain_decided", run_id=handle.run_id, **handle.decision)
        await self._prune()

    async def _prune(self) -> None:
        served = self.served
        await asyncio.to_thread(self.retention.prune, None if served is None else served.checkpoint)

    async def _pump(self, handle: RunHandle, stream: EventStream) -> None:
        async for record in stream:
            handle.add(record)
            if record["event"] == "run_start":
                self.runs[handle.run_id or ""] = handle
                while len(self.runs) > self.settings.keep_runs:
                    self.runs.popitem(last=False)


def _compare(
    candidate: Any, served: ServedModel | None, split: Split
) -> tuple[dict[str, float], dict[str, float]]:
    """The candidate's and the served model's metrics on the same held-out recipients."""
    new = evaluate(candidate, split.val)
    old = evaluate(served.model, split.val) if served is not None else {}
    return new, old

"""``MLflowLogger``: the run as an MLflow run, through an ``MlflowClient`` of its own. Never
MLflow's global active run, so two runs in one process, or a user's own, do not collide. By
default a local store beside the runs, ``sqlite:///<log_dir>/mlflow.db`` (artifacts under
``<log_dir>/mlartifacts``). Needs ``mlflow-skinny`` (the ``trackers`` extra), imported on the
tracker's thread.

Example::

    tracker = MLflowLogger(tracking_uri="http://mlflow.internal:5000", experiment_name="bert")
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from typing_extensions import override

from core.callbacks import Record
from core.trackers.base import Status, TrackedRun, Tracker, check_names, require
from core.trackers.convert import ParamValue, Scalar
from core.trackers.worker import import_lock

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = ("MLflowLogger",)

_PARAMS_PER_CALL = 100
_METRICS_PER_CALL = 1000
_MAX_PARAM_CHARS = 500


class MLflowLogger(Tracker):
    """Logs the run to MLflow; ``run_id`` is the MLflow run's id once it is open."""

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment_name: str | None = None,
        run_name: str | None = None,
        *,
        flush_every: int = 200,
        rank_zero_only: bool = True,
    ) -> None:
        super().__init__(flush_every=flush_every, rank_zero_only=rank_zero_only)
        check_names(tracking_uri=tracking_uri, experiment_name=experiment_name, run_name=run_name)
        require("mlflow", type(self).__name__)
        if tracking_uri is None:  # the default sqlite store
            require("sqlalchemy", type(self).__name__)
            require("alembic", type(self).__name__)
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.resolved_tracking_uri: str | None = None  # of the current run, once open
        self.run_id: str | None = None
        self._client: MlflowClient | None = None

    @override
    def _open(self, run: TrackedRun, run_start: Record) -> None:
        with import_lock:  # slow (seconds): on the tracker's thread
            from mlflow import MlflowClient

        with _quiet_store_creation():  # "Creating initial MLflow database tables..."
            self._open_run(MlflowClient, run)

    def _open_run(self, client_class: type[MlflowClient], run: TrackedRun) -> None:
        uri, artifacts = self.tracking_uri, None
        # The default store is sqlite: MLflow 3 refuses its old file store unless an environment
        # variable allows it (browse: mlflow ui --backend-store-uri sqlite:///<log_dir>/mlflow.db).
        if uri is None:
            root = run.log_dir.resolve()
            root.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{(root / 'mlflow.db').as_posix()}"
        if uri.startswith("sqlite:///"):  # a local database: its artifacts beside it, not
            # in the working directory's ./mlruns where MLflow puts them otherwise
            database = Path(uri.removeprefix("sqlite:///")).resolve()
            artifacts = (database.parent / "mlartifacts").as_uri()
        client = client_class(uri)
        experiment_id = _experiment(client, self.experiment_name or run.experiment, artifacts)
        tags = {"core.run_id": run.run_id, "core.rank": str(run.rank)}
        if run.run_dir is not None:
            tags["core.run_dir"] = str(run.run_dir)
        created = client.create_run(experiment_id, run_name=self.run_name or run.name, tags=tags)
        self._client, self.run_id = client, created.info.run_id
        self.resolved_tracking_uri = uri

    @override
    def _log_params(self, params: dict[str, ParamValue]) -> None:
        from mlflow.entities import Param

        client, run_id = self._opened()
        entries = [Param(key, str(value)[:_MAX_PARAM_CHARS]) for key, value in params.items()]
        for start in range(0, len(entries), _PARAMS_PER_CALL):
            client.log_batch(run_id, params=entries[start : start + _PARAMS_PER_CALL])

    @override
    def _log_text(self, name: str, text: str) -> None:
        client, run_id = self._opened()
        client.log_text(run_id, text, f"{name}.md")

    @override
    def _log_scalars(self, rows: list[Scalar]) -> None:
        from mlflow.entities import Metric

        client, run_id = self._opened()
        entries = [Metric(r.name, r.value, int(r.wall_time * 1000), r.step) for r in rows]
        for start in range(0, len(entries), _METRICS_PER_CALL):
            client.log_batch(run_id, metrics=entries[start : start + _METRICS_PER_CALL])

    @override
    def _log_artifact(self, path: Path) -> None:
        client, run_id = self._opened()
        client.log_artifact(run_id, str(path))

    @override
    def _close(self, status: Status) -> None:
        if self._client is not None and self.run_id is not None:
            self._client.set_terminated(self.run_id, status)
            self._client = None

    def _opened(self) -> tuple[MlflowClient, str]:
        if self._client is None or self.run_id is None:
            raise RuntimeError("MLflowLogger was not opened")
        return self._client, self.run_id


class _QuietLoggers:
    """MLflow's and alembic's loggers at WARNING while any tracker opens a store (a new
    SQLite store logs its migrations at INFO on stderr); their levels come back after."""

    names = ("mlflow", "alembic")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: dict[str, int] = {}

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                for name in self.names:
                    logger = logging.getLogger(name)
                    self._saved[name] = logger.level
                    if logger.getEffectiveLevel() < logging.WARNING:
                        logger.setLevel(logging.WARNING)
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    for name, level in self._saved.items():
                        logging.getLogger(name).setLevel(level)
                    self._saved.clear()


_quiet_store_creation = _QuietLoggers()


def _experiment(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    """The id of experiment ``name``, created (or restored from deletion) when needed."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException:  # created meanwhile by another run
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    return str(experiment.experiment_id)

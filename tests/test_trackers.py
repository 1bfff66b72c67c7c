"""Trackers log what the run's records say: CSV, TensorBoard and MLflow read back equal."""

from __future__ import annotations

import csv
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from PIL import Image

from core import TrainingConfig, create_optimized_training_optimizer
from core.callbacks import Record
from core.errors import ConfigError
from core.trackers import CSVLogger, MLflowLogger, TensorBoardLogger, Tracker
from core.trackers.base import Status, TrackedRun, TrackerUnavailableError, require
from core.trackers.convert import ParamValue, Scalar, flatten_params, scalars_of
from tests.helpers import loaders, make_model

# MLflow's sqlite store uses a loader strategy SQLAlchemy 2.1 deprecates (not ours to fix).
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy")


class Broken(Tracker):
    """A tracker whose backend fails at its first scalar write."""

    def __init__(self) -> None:
        super().__init__(flush_every=1)
        self.calls: list[str] = []

    def _open(self, run: TrackedRun, run_start: Record) -> None:
        self.calls.append("open")

    def _log_params(self, params: dict[str, ParamValue]) -> None:
        self.calls.append("params")

    def _log_text(self, name: str, text: str) -> None:
        self.calls.append(f"text:{name}")

    def _log_scalars(self, rows: list[Scalar]) -> None:
        raise OSError("tracking server unreachable")

    def _log_artifact(self, path: Path) -> None:
        self.calls.append(f"artifact:{path.name}")

    def _close(self, status: Status) -> None:
        self.calls.append(f"close:{status}")


@dataclass
class Tracked:
    run_dir: Path
    events: list[dict[str, Any]]
    csv: CSVLogger
    tensorboard: TensorBoardLogger
    mlflow: MLflowLogger
    broken: Broken

    def of(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.events if r["event"] == event]


def mlflow_client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(uri)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> Tracked:
    """One real 2-epoch run (8 steps) with every tracker, and one whose backend fails."""
    root = tmp_path_factory.mktemp("trackers")
    log_dir = root / "logs"
    log_dir.mkdir()
    # Create the default MLflow store before the run: a cold import and database creation
    # take seconds, longer than this tiny run plus the 5 s grace callbacks get at its end
    # (reports are off for the same reason; report files are tested by hand below).
    mlflow_client(f"sqlite:///{(log_dir / 'mlflow.db').as_posix()}").search_experiments()
    trackers = CSVLogger(), TensorBoardLogger(root / "tb"), MLflowLogger(), Broken()
    train, val = loaders(n=128)
    job = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=train,
        val_loader=val,
        log_dir=log_dir,
        max_epochs=2,
        progress=False,
        reports=False,
        callbacks=list(trackers),
    )
    results = anyio.run(job.train)
    lines = (results.run_dir / "events.jsonl").read_text().splitlines()
    return Tracked(results.run_dir, [json.loads(line) for line in lines], *trackers)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_the_csv_holds_every_value_of_the_records(tracked: Tracked) -> None:
    assert tracked.csv.path == tracked.run_dir / "metrics.csv"
    rows = read_csv(tracked.csv.path)
    steps = tracked.of("train_step")
    losses = [r for r in rows if r["name"] == "train/loss"]
    assert len(steps) == 8 and len(losses) == len(steps)
    assert [(int(r["step"]), int(r["epoch"]), float(r["value"])) for r in losses] == [
        (s["step"], s["epoch"], s["loss"]) for s in steps
    ]
    assert not [r for r in rows if r["name"] == "train/loss_scale"]  # null: skipped
    val = [(int(r["step"]), float(r["value"])) for r in rows if r["name"] == "val/loss"]
    assert val == [(v["step"], v["val_loss"]) for v in tracked.of("validation")]
    epochs = [float(r["value"]) for r in rows if r["name"] == "epoch/train_loss"]
    assert epochs == [e["train_loss"] for e in tracked.of("epoch_end")]
    params = dict((r["name"], r["value"]) for r in read_csv(tracked.run_dir / "params.csv"))
    assert params["run.max_epochs"] == "2" and params["run.seed"] == "None"
    assert params["optim.learning_rate"] == "0.001"


@pytest.mark.slow
def test_tensorboard_shows_the_scalars_and_the_hparams_table(tracked: Tracked) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = tracked.tensorboard.path
    assert path == tracked.run_dir.parents[2] / "tb" / "experiment" / tracked.run_dir.name
    events = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    losses = events.Scalars("train/loss")
    steps = tracked.of("train_step")
    assert [e.step for e in losses] == [s["step"] for s in steps]
    assert [e.value for e in losses] == pytest.approx([s["loss"] for s in steps], rel=1e-6)
    assert len(events.Scalars("val/accuracy")) == 2
    hparams = events.Tensors("hparams/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| run.max_epochs | 2 |" in hparams
    assert "model_summary/text_summary" in events.Tags()["tensors"]


@pytest.mark.slow
def test_mlflow_holds_the_metrics_params_and_status(tracked: Tracked) -> None:
    uri, run_id = tracked.mlflow.resolved_tracking_uri, tracked.mlflow.run_id
    assert uri is not None and run_id is not None
    client = mlflow_client(uri)
    history = client.get_metric_history(run_id, "train/loss")
    steps = tracked.of("train_step")
    assert [(m.step, m.value) for m in history] == [(s["step"], s["loss"]) for s in steps]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == tracked.run_dir.name
    assert run.data.params["run.max_epochs"] == "2"
    assert run.data.tags["core.run_id"] == tracked.run_dir.name
    assert client.get_experiment(run.info.experiment_id).name == "experiment"
    assert "model_summary.md" in [a.path for a in client.list_artifacts(run_id)]


@pytest.mark.slow
def test_a_failing_backend_is_reported_once_closed_and_training_goes_on(
    tracked: Tracked,
) -> None:
    failures = [r for r in tracked.events if r.get("kind") == "callback_failed"]
    assert len(failures) == 1 and failures[0]["callback"] == "Broken"
    assert failures[0]["error"] == "OSError: tracking server unreachable"
    assert tracked.of("run_end")[0]["status"] == "completed"
    assert tracked.broken.calls[:3] == ["open", "params", "text:model_summary"]
    assert tracked.broken.calls[-1] == "close:FAILED"  # cleaned up, then never called again
    assert not [c for c in tracked.broken.calls if c.startswith("artifact")]


@dataclass
class FakeRun:
    """A stand-in for the run a callback observes."""

    run_dir: Path | None
    rank: int = 0
    world_size: int = 1
    config: TrainingConfig = field(default_factory=TrainingConfig)

    @property
    def is_global_zero(self) -> bool:
        return self.rank == 0


def records(run_id: str = "r1", steps: int = 3) -> list[Record]:
    start = {"event": "run_start", "run_id": run_id, "config": {"run": {"max_epochs": 1}}}
    train = [
        {"event": "train_step", "step": s, "epoch": 0, "loss": 1.0 / s, "lr": 0.1}
        for s in range(1, steps + 1)
    ]
    end = {"event": "run_end", "status": "completed"}
    return [start, *train, end]


async def replay(tracker: Tracker, run: FakeRun, run_id: str = "r1") -> None:
    for record in records(run_id):
        await tracker.on_record(run, record)
    await tracker.on_run_closed(run)


def write_reports(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    Image.new("RGB", (6, 4), (255, 0, 0)).save(run_dir / "training_metrics.png")
    (run_dir / "performance_summary.txt").write_text("steps: 3\nsamples/s: 100\n")


@pytest.mark.anyio
async def test_only_rank_zero_tracks_unless_asked(tmp_path: Path) -> None:
    quiet, loud = CSVLogger(tmp_path / "quiet"), CSVLogger(tmp_path, rank_zero_only=False)
    run = FakeRun(run_dir=tmp_path / "run", rank=1, world_size=2)
    await replay(quiet, run)
    await replay(loud, run)
    assert not (tmp_path / "quiet").exists() and quiet.path is None
    assert loud.path == tmp_path / "metrics-rank1.csv"
    assert len(read_csv(loud.path)) == 6 and (tmp_path / "params-rank1.csv").is_file()


@pytest.mark.anyio
async def test_report_files_become_artifacts(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = FakeRun(run_dir=tmp_path / "logs" / "experiment" / "r1")
    write_reports(run.run_dir)  # type: ignore[arg-type]
    copy, board = CSVLogger(tmp_path / "copy"), TensorBoardLogger(tmp_path / "tb", name="exp")
    await replay(copy, run)
    await replay(board, run)
    assert (tmp_path / "copy" / "training_metrics.png").read_bytes() == (
        run.run_dir / "training_metrics.png"  # type: ignore[operator]
    ).read_bytes()
    assert board.path == tmp_path / "tb" / "exp" / "r1"
    events = EventAccumulator(str(board.path), size_guidance={"images": 0}).Reload()
    image = events.Images("training_metrics")[0]
    assert (image.width, image.height) == (6, 4)
    assert "performance_summary/text_summary" in events.Tags()["tensors"]


@pytest.mark.slow
@pytest.mark.anyio
async def test_mlflow_uploads_reports_and_a_reused_tracker_opens_a_new_run(
    tracked: Tracked, tmp_path: Path
) -> None:
    uri = tracked.mlflow.resolved_tracking_uri
    tracker = MLflowLogger(uri, experiment_name="by-hand")
    run = FakeRun(run_dir=tmp_path / "r1")
    write_reports(tmp_path / "r1")
    await replay(tracker, run, "r1")
    first = tracker.run_id
    await replay(tracker, FakeRun(run_dir=None), "r2")
    client = mlflow_client(uri)  # type: ignore[arg-type]
    assert sorted(a.path for a in client.list_artifacts(first)) == [
        "performance_summary.txt",
        "training_metrics.png",
    ]
    second = client.get_run(tracker.run_id)
    assert tracker.run_id != first and second.info.run_name == "r2"
    assert second.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(first, "train/loss")] == [1.0, 0.5, 1 / 3]


class Slow(Broken):
    """Its backend opens only when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.release, self.closed = threading.Event(), threading.Event()

    def _open(self, run: TrackedRun, run_start: Record) -> None:
        self.release.wait(10)

    def _close(self, status: Status) -> None:
        super()._close(status)
        self.closed.set()


@pytest.mark.anyio
async def test_a_cancelled_tracker_still_closes_its_backend(tmp_path: Path) -> None:
    tracker, run = Slow(), FakeRun(run_dir=tmp_path)
    start, *_ = records()
    await tracker.on_record(run, start)  # returns at once: the open runs on its thread
    with anyio.move_on_after(0.05):  # run_end waits for the backend: the grace runs out
        await tracker.on_record(run, {"event": "run_end", "status": "completed"})
    tracker.release.set()
    assert await anyio.to_thread.run_sync(tracker.closed.wait, 10)
    assert tracker.calls[-1] == "close:FINISHED"  # run_end was seen: the run's own status
    await tracker.on_run_closed(run)  # no longer tracking: nothing more happens
    assert tracker.calls[-1] == "close:FINISHED"


def test_records_become_scalars_and_params() -> None:
    step = {
        "event": "train_step",
        "step": 4,
        "epoch": 1,
        "loss": 0.5,
        "accuracy": 0.75,
        "grad_norm": None,
        "lr": 0.1,
        "loss_scale": float("inf"),
        "ts": "2026-01-01T00:00:00.000000Z",
    }
    assert scalars_of(step) == [
        Scalar("train/loss", 0.5, 4, 1, 1767225600.0),
        Scalar("train/accuracy", 0.75, 4, 1, 1767225600.0),
        Scalar("train/lr", 0.1, 4, 1, 1767225600.0),
    ]
    val = {"event": "validation", "step": 4, "val_loss": 0.25, "metrics": {"f1": 0.8, "x": None}}
    assert [(s.name, s.value, s.epoch) for s in scalars_of(val)] == [
        ("val/loss", 0.25, None),
        ("val/f1", 0.8, None),
    ]
    assert scalars_of({"event": "gpu_sample", "step": 1, "util_pct": 50.0}) == []
    tree = {"a": {"b": [1, 2], "c": None, "d": {"e": True}}, "f": 1.5}
    assert flatten_params(tree) == {"a.b": "[1, 2]", "a.c": "None", "a.d.e": True, "f": 1.5}


def test_bad_arguments_and_missing_packages_are_named() -> None:
    with pytest.raises(ConfigError, match=r"flush_every=0 is invalid"):
        CSVLogger(flush_every=0)
    with pytest.raises(ConfigError, match=r"rank_zero_only='no' is invalid"):
        TensorBoardLogger(rank_zero_only="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"tracking_uri='' is invalid"):
        MLflowLogger(tracking_uri="")
    hint = r"pip install -e '\.\[trackers\]' in core's checkout"
    with pytest.raises(ImportError, match=hint) as error:
        require("no_such_tracking_backend", "MyLogger")
    assert isinstance(error.value, TrackerUnavailableError)
    assert isinstance(error.value, ConfigError)

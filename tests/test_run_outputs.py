"""What a user sees and keeps from a real run: the console, the reports, the trackers' files,
the model summary and the initial-weights lineage in ``run_start``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from PIL import Image

from core import (
    CSVLogger,
    MLflowLogger,
    TensorBoardLogger,
    create_optimized_training_optimizer,
    seed_everything,
    summarize_model,
    wait_for_reports,
)
from tests.helpers import loaders, make_model


def train(tmp_path: Path, model: torch.nn.Module | None = None, **settings: Any) -> Any:
    train_loader, val_loader = loaders(n=128, batch_size=32)
    optimizer = create_optimized_training_optimizer(
        model=model or make_model(),
        train_loader=train_loader,
        val_loader=val_loader,
        log_dir=tmp_path,
        max_epochs=2,
        monitor_interval_s=0.05,
        **settings,
    )
    results = anyio.run(optimizer.train)
    optimizer.close()
    return results


def run_start(results: Any) -> dict[str, Any]:
    first = (results.run_dir / "events.jsonl").read_text().splitlines()[0]
    record: dict[str, Any] = json.loads(first)
    return record


@pytest.mark.plots
def test_a_default_run_shows_banner_epochs_and_summary_and_writes_its_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = train(tmp_path)
    err = capsys.readouterr().err
    assert "\r" not in err  # not a terminal: plain lines, no carriage-return floods
    assert "parameters" in err and str(results.run_dir) in err  # the banner
    assert err.count("epoch 1/2") >= 1 and err.count("epoch 2/2") >= 1
    assert "completed" in err and "performance_summary.txt" in err  # the end summary
    assert wait_for_reports(results.run_dir) == [
        results.run_dir / "performance_summary.txt",
        results.run_dir / "training_metrics.png",
    ]  # written in the background, after train() returned
    summary = (results.run_dir / "performance_summary.txt").read_text()
    assert "Throughput" in summary and "Step time" in summary
    with Image.open(results.run_dir / "training_metrics.png") as image:
        assert image.size == (1400, 1000)
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
        assert colours is not None and len(colours) > 100  # not blank


def test_progress_and_reports_can_be_turned_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = train(tmp_path, progress=False, reports=False)
    assert capsys.readouterr().err == ""
    assert not (results.run_dir / "training_metrics.png").exists()
    assert not (results.run_dir / "performance_summary.txt").exists()


@pytest.mark.slow
@pytest.mark.plots
def test_trackers_receive_the_reports_at_the_end(tmp_path: Path) -> None:
    mlflow, board = MLflowLogger(), TensorBoardLogger(log_dir=tmp_path / "runs")
    results = train(tmp_path, callbacks=[CSVLogger(), mlflow, board], progress=False)
    from mlflow import MlflowClient

    client = MlflowClient(mlflow.resolved_tracking_uri)
    artifacts = {a.path for a in client.list_artifacts(mlflow.run_id)}
    assert {"training_metrics.png", "performance_summary.txt"} <= artifacts
    assert client.get_run(mlflow.run_id).info.status == "FINISHED"
    rows = (results.run_dir / "metrics.csv").read_text().splitlines()
    assert sum(",train/loss," in row for row in rows) == results.global_step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (tmp_path / "runs").rglob("events.out.tfevents.*")
    board_file = EventAccumulator(str(events), size_guidance={"images": 0})
    board_file.Reload()
    assert board_file.Tags()["images"]  # the training plot


def test_run_start_holds_the_model_summary_the_plan_and_the_weights_lineage(
    tmp_path: Path,
) -> None:
    seed_everything(3)
    first = run_start(train(tmp_path, model=torch.nn.Linear(8, 2), seed=3))
    seed_everything(3)
    again = run_start(train(tmp_path, model=torch.nn.Linear(8, 2), seed=3))
    seed_everything(4)
    other = run_start(train(tmp_path, model=torch.nn.Linear(8, 2), seed=4))
    assert first["model_init_matches_previous"] is None  # the experiment's first run
    assert again["model_init_matches_previous"] is True
    assert other["model_init_matches_previous"] is False
    assert first["model_init_hash"] == again["model_init_hash"] != other["model_init_hash"]
    assert first["seed"] == 3
    model = make_model()
    start = run_start(train(tmp_path, model=model))
    assert start["model_summary"] == json.loads(json.dumps(summarize_model(make_model())))
    assert start["plan"] | {"max_epochs": 2} == {
        "max_epochs": 2,
        "max_steps": None,
        "batches_per_epoch": 4,
        "steps_per_epoch": 4,
        "effective_batch_size": 32,
        "world_size": 1,
        "has_validation": True,
        "val_every_n_epochs": 1,
        "val_every_n_steps": None,
        "save_best": False,
        "save_top_k": 0,
        "monitor": "val_loss",
        "mode": "min",
    }

"""Seed 002's snippets (and seed 000's four calls) run as written on CPU: the per-batch
faces drive the run's own step code, so their weights equal a hand-written autocast loop's."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from core import ConfigError, TrainingConfig
from core.hardware.device import Device
from core.mixed_precision_training import (
    LossScalerConfig,
    MixedPrecisionConfig,
    MixedPrecisionOptimizer,
    MixedPrecisionTrainer,
    create_mixed_precision_optimizer,
    create_mixed_precision_trainer,
)
from core.optimized_training_optimizer import create_optimized_training_optimizer
from tests.helpers import loaders, make_classification, make_model

SEED_METRICS = {
    "loss",
    "accuracy",
    "step_time",
    "loss_scale",
    "overflow",
    "skipped",
    "lr",
    "grad_norm",
}


def weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_the_basic_usage_loop_returns_the_seed_metrics() -> None:
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters())
    mp_trainer = create_mixed_precision_trainer(
        model=model,
        optimizer=optimizer,
        enable_amp=True,
        dtype=torch.float16,
        enable_grad_scaler=True,
    )
    dataloader, _ = loaders(n=64, batch_size=16, val=False)
    for batch in dataloader:
        inputs, targets = batch
        metrics = mp_trainer.train_step((inputs, targets), nn.CrossEntropyLoss(), "cpu")
        assert metrics.keys() >= SEED_METRICS
        assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["loss"] > 0.0
        assert metrics["loss_scale"] == 2.0**16 and metrics["precision"] == "fp16"
        assert metrics["overflow"] is False and metrics["skipped"] is False
        assert metrics["lr"] == 1e-3 and metrics["step_time"] > 0.0
    stats = mp_trainer.get_amp_stats()
    assert (stats["total_steps"], stats["amp_steps"], stats["scaler_updates"]) == (4, 4, 4)
    assert stats["amp_usage_ratio"] == 1.0 and stats["overflow_ratio"] == 0.0
    check = mp_trainer.validate_step((inputs, targets))
    assert check["loss"] > 0.0 and check["accuracy"] is not None and model.training
    regression = mp_trainer.validate_step((inputs, inputs[:, :2]), nn.MSELoss())
    assert regression["accuracy"] is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_train_steps_equal_a_hand_written_autocast_loop(dtype: torch.dtype) -> None:
    ours, theirs = make_model(), make_model()
    ours_opt = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    their_opt = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
    trainer = create_mixed_precision_trainer(ours, ours_opt, dtype=dtype)
    for inputs, targets in loaders(n=96, batch_size=16, val=False)[0]:
        trainer.train_step((inputs, targets), nn.CrossEntropyLoss())
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype != torch.float32):
            loss = F.cross_entropy(theirs(inputs), targets)
        loss.backward()
        their_opt.step()
        their_opt.zero_grad(set_to_none=True)
    for a, b in zip(weights(ours), weights(theirs), strict=True):
        if dtype == torch.float32:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_an_fp16_overflow_is_skipped_on_the_step_and_backs_off_the_scale() -> None:
    model = make_model()
    trainer = create_mixed_precision_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), dtype="float16", init_scale=2**16
    )
    inputs, targets = next(iter(loaders(n=16, batch_size=16, val=False)[0]))
    before = weights(model)
    huge = trainer.train_step((inputs, targets), lambda o, t: F.cross_entropy(o, t) * 1e8)
    assert huge["overflow"] is True and huge["skipped"] is True
    assert huge["loss_scale"] == 2.0**16  # the scale the step used
    assert all(torch.equal(a, b) for a, b in zip(before, weights(model), strict=True))
    stats = trainer.get_amp_stats()
    assert stats["current_scale"] == 2.0**15 and stats["overflow_count"] == 1
    fine = trainer.train_step((inputs, targets), nn.CrossEntropyLoss())
    assert fine["skipped"] is False and fine["loss_scale"] == 2.0**15
    assert not torch.equal(before[0], weights(model)[0])


def test_the_advanced_configuration_maps_the_seed_names(tmp_path: Path) -> None:
    config = MixedPrecisionConfig(
        enable_amp=True,
        dtype=torch.float16,
        enable_grad_scaler=True,
        init_scale=2**16,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=2000,
        enable_monitoring=True,
        log_amp_stats=True,
        track_memory_usage=True,
        validate_amp=True,
        check_compatibility=True,
    )
    assert config.scaler == LossScalerConfig(
        init_scale=2**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000
    )
    seed_000 = MixedPrecisionConfig(
        enabled=True,
        dtype="bfloat16",
        loss_scaling=True,
        initial_scale=2**15,
        growth_factor=1.5,
        hysteresis=2000,
        min_scale=1.0,
        max_scale=2**24,
    )
    assert seed_000.scaler.init_scale == 2**15 and seed_000.scaler.hysteresis == 2000
    saved = TrainingConfig(precision=seed_000).to_dict()["precision"]
    assert "initial_scale" not in saved and saved["scaler"]["init_scale"] == 2**15  # one leaf
    assert TrainingConfig.from_dict({"precision": saved}).precision == seed_000
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 2))
    logger = logging.getLogger("seed_002")
    mp_trainer = MixedPrecisionTrainer(
        config=config, model=model, optimizer=torch.optim.Adam(model.parameters()), logger=logger
    )
    assert mp_trainer.device == torch.device("cpu") and mp_trainer.amp_precision.name == "fp16"
    assert mp_trainer.compatibility is not None and mp_trainer.compatibility["compatible"]
    assert "BatchNorm" in mp_trainer.compatibility["warnings"][0]
    lean = MixedPrecisionTrainer(MixedPrecisionConfig(dtype="bf16", memory_efficient=True))
    assert lean.describe()["cache_enabled"] is False  # autocast's weight cache off
    off = MixedPrecisionTrainer(MixedPrecisionConfig(dtype="bf16", autocast_enabled=False))
    assert off.amp_precision.name == "fp32" and off.config.enable_amp is False


def test_enabled_false_starts_in_fp32_until_enable_amp() -> None:
    model = make_model()
    trainer = create_mixed_precision_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), dtype="bf16", enabled=False
    )
    batch = next(iter(loaders(n=16, batch_size=16, val=False)[0]))
    assert trainer.train_step(batch)["precision"] == "fp32"
    trainer.enable_amp()
    assert trainer.train_step(batch)["precision"] == "bf16"
    assert trainer.get_amp_stats()["amp_usage_ratio"] == 0.5


def test_amp_stats_measure_the_memory_saving_and_save_as_json(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4)
    )
    batch = (torch.randn(256, 16), torch.randint(0, 4, (256,)))
    trainer = create_mixed_precision_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.01), dtype="bf16", track_memory_usage=True
    )
    assert trainer.get_amp_stats()["avg_memory_savings"] is None  # before the first step
    trainer.train_step(batch)
    stats = trainer.get_amp_stats()
    # Activations of 256 samples dominate: bf16 halves them (live CPU storages, measured).
    assert stats["avg_memory_savings"] > 0.0
    assert "bytes in fp32" in stats["memory_savings_note"] and stats["total_steps"] == 1
    path = trainer.save_amp_stats(tmp_path / "logs" / "amp_stats.json")
    saved = json.loads(path.read_text())
    assert saved["avg_memory_savings"] == stats["avg_memory_savings"]
    assert {
        "total_steps",
        "amp_steps",
        "scaler_updates",
        "overflow_count",
        "current_scale",
        "amp_usage_ratio",
        "overflow_ratio",
        "avg_step_time",
    } <= saved.keys()
    untracked = create_mixed_precision_trainer(
        model, torch.optim.SGD(model.parameters()), dtype="bf16"
    )
    assert untracked.get_amp_stats()["avg_memory_savings"] is None
    assert "track_memory_usage is off" in untracked.get_amp_stats()["memory_savings_note"]


def test_seed_000_four_calls_equal_train_step() -> None:
    config = MixedPrecisionConfig(enabled=True, dtype="float16", loss_scaling=True)
    trainer = MixedPrecisionTrainer(config)
    model, other = make_model(), make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    reference = create_mixed_precision_trainer(
        other, torch.optim.Adam(other.parameters(), lr=1e-2), dtype="float16"
    )
    criterion = nn.CrossEntropyLoss()
    for data, targets in loaders(n=64, batch_size=16, val=False)[0]:
        predictions = trainer.forward_pass(model, data)
        loss = trainer.compute_loss(criterion, predictions, targets)
        trainer.backward_pass(loss, optimizer)
        step = trainer.optimizer_step(optimizer)
        assert step["skipped"] is False and step["loss_scale"] == 2.0**16
        assert step["loss"] == reference.train_step((data, targets), criterion)["loss"]
    assert all(torch.equal(a, b) for a, b in zip(weights(model), weights(other), strict=True))
    assert trainer.get_amp_stats()["total_steps"] == 4
    with pytest.raises(RuntimeError, match="no backward_pass"):
        trainer.optimizer_step(optimizer)


def test_mixed_precision_optimizer_trains_and_validates_epochs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emptied: list[str] = []  # empty_cache stands in for CUDA's (a no-op on CPU)
    monkeypatch.setattr(Device, "empty_cache", lambda self: emptied.append(str(self.torch)))
    model = make_model()
    mp = create_mixed_precision_optimizer(
        model, torch.optim.Adam(model.parameters(), lr=1e-2), dtype="bf16", clear_cache=True
    )
    train, val = loaders(n=64, batch_size=16)
    epoch = mp.train_epoch(train)
    assert (epoch["steps"], epoch["samples"], epoch["skipped_steps"]) == (4, 64, 0)
    assert 0.0 <= epoch["accuracy"] <= 1.0 and epoch["amp"]["amp_steps"] == 4
    assert val is not None
    checked = mp.validate_epoch(val)
    assert checked["samples"] == 64 and checked["accuracy"] is not None
    stats = mp.get_training_stats()
    assert [e["epoch"] for e in stats["epochs"]] == [0] and len(stats["validations"]) == 1
    assert stats["amp"]["total_steps"] == 4 and emptied == ["cpu", "cpu"]
    plain = MixedPrecisionOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert plain.train_epoch(train)["loss"] is not None
    plain.cleanup()


def test_config_errors_name_the_field_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"^dtype='float8' is invalid; allowed: 'auto'"):
        MixedPrecisionConfig(dtype="float8")
    with pytest.raises(ConfigError, match=r"^loss_scaling=True .* enable_grad_scaler=False"):
        MixedPrecisionConfig(loss_scaling=True, enable_grad_scaler=False)
    with pytest.raises(ConfigError, match=r"^initial_scale=2\.0 .* init_scale=4\.0 sets it"):
        MixedPrecisionConfig(initial_scale=2.0, init_scale=4.0)
    with pytest.raises(ConfigError, match=r"^init_scale=8 .* scaler=LossScalerConfig"):
        MixedPrecisionConfig(init_scale=8, scaler=LossScalerConfig(hysteresis=2))
    with pytest.raises(ConfigError, match=r"^initial_scale=0\.0 is invalid; allowed: a finite"):
        MixedPrecisionConfig(initial_scale=0.0)
    with pytest.raises(ConfigError, match=r"^model=None is invalid.*create_mixed_precision"):
        MixedPrecisionTrainer(MixedPrecisionConfig()).train_step((torch.ones(1), torch.ones(1)))


def test_the_optimized_training_integration_snippet_trains_one_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emptied: list[str] = []  # empty_cache stands in for CUDA's (a no-op on CPU)
    monkeypatch.setattr(Device, "empty_cache", lambda self: emptied.append(str(self.torch)))
    model = make_model()
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(make_classification(64), batch_size=16),
        val_loader=DataLoader(make_classification(32, seed=1), batch_size=16),
        enable_amp=True,
        amp_dtype=torch.float16,
        enable_grad_scaler=True,
        amp_init_scale=2**16,
        amp_growth_factor=2.0,
        amp_backoff_factor=0.5,
        amp_growth_interval=2000,
        amp_monitoring=True,
        amp_log_stats=True,
        amp_track_memory=True,
        amp_validate=True,
        amp_check_compatibility=True,
        max_epochs=1,
        log_dir=tmp_path,
        progress=False,
        reports=False,
        config=TrainingConfig(precision=MixedPrecisionConfig(clear_cache=True)),
    )
    precision = optimizer.config.precision
    assert precision.track_memory_usage and precision.scaler.init_scale == 2**16
    results = anyio.run(optimizer.train)
    assert results.epochs_completed == 1
    records = [json.loads(x) for x in (optimizer.run_dir / "events.jsonl").read_text().splitlines()]
    (report,) = [r for r in records if r["event"] == "amp_compatibility"]
    assert report["compatible"] is True and report["dtype"] == "fp16"
    stats = optimizer.mixed_precision.get_amp_stats()
    assert stats["total_steps"] == 4 and stats["avg_memory_savings"] is not None
    assert emptied == ["cpu"]  # clear_cache: once, after the epoch


@pytest.mark.processes
def test_the_demo_command_runs_as_written_and_writes_its_table_and_plot(tmp_path: Path) -> None:
    # The seed's own command, from the repository's root: python run_mixed_precision_demo.py
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "run_mixed_precision_demo.py", "--quick"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "demo")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "fp32" in out and "bf16" in out and "fp16" in out
    assert "on CPU, AMP is not expected to be faster" in out
    table = (tmp_path / "demo" / "table.txt").read_text()
    assert table.splitlines()[1].split()[:3] == ["precision", "samples/s", "speed-up"]
    results: list[dict[str, Any]] = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert [r["precision"] for r in results] == ["fp32", "bf16", "fp16"]
    assert (tmp_path / "demo" / "comparison.png").stat().st_size > 1000

"""Seed 000's snippets, run as written (adapted only where the seed is pseudo-code): the
integrated system (set up, train, clean up), GPUConfig's place in the config tree,
GPUManager, GPUMemoryOptimizer through the root module, GPUPerformanceMonitor, and the
per-batch MixedPrecisionTrainer."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trio", reason="seed 000's trio case needs pip install -e .[dev]")

import torch
import trio
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import core.gpu_utilization_mixed_precision_system as face
from core.errors import ConfigError
from gpu_utilization_mixed_precision_system import (
    GPUConfig,
    GPUManager,
    GPUMemoryOptimizer,
    GPUPerformanceMonitor,
    IntegratedGPUTrainingSystem,
    MixedPrecisionConfig,
    MixedPrecisionTrainer,
)
from tests.helpers import make_model

SEED_METRICS = {
    "gpu_utilization",
    "memory_allocated_gb",
    "memory_reserved_gb",
    "memory_utilization",
    "temperature",
    "power_w",
    "timestamp",
}


@pytest.fixture(autouse=True)
def _restore_device_settings() -> Iterator[None]:
    """GPUManager.apply() flips process-wide switches (on CUDA): put them back."""
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
    )
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved[1:]
    if torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(1.0)


def digits(n: int = 256, seed: int = 0) -> TensorDataset:
    """784 features, 10 classes read off the first ten features: learnable in a few steps."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 784, generator=generator)
    return TensorDataset(x, x[:, :10].argmax(dim=1))


class Blocks(nn.Module):
    """Two repeated composite blocks: what gradient checkpointing applies to."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2)))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(x))
        return out


def test_the_root_module_re_exports_the_face() -> None:
    for name in face.__all__:
        assert getattr(face, name) is globals()[name]


def test_basic_usage_sets_up_trains_and_cleans_up(tmp_path: Path) -> None:
    # "Uso Básico", as the seed writes it; log_dir, progress and the search bound are ours.
    gpu_config = GPUConfig(
        device_ids=[0],
        memory_fraction=0.9,
        enable_mixed_precision=True,
        enable_gradient_checkpointing=True,
        enable_data_parallel=False,
        pin_memory=True,
        num_workers=4,
    )
    mixed_precision_config = MixedPrecisionConfig(
        enabled=True, dtype="float16", loss_scaling=True, initial_scale=2**16, growth_factor=2.0
    )
    training_system = IntegratedGPUTrainingSystem(
        gpu_config, mixed_precision_config, log_dir=tmp_path, progress=False, max_batch_size=64
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))
    input_shape = (32, 784)
    setup_info = training_system.setup_training(model, input_shape)

    assert setup_info["optimal_batch_size"] == 64  # the search's bound: 64 samples fit
    assert [t["batch_size"] for t in setup_info["batch_size_search"]["trials"]] == [32, 64]
    assert setup_info["precision"] == "fp16"
    assert setup_info["device"] == str(training_system.device)
    assert setup_info["model_optimization"]["activation_checkpointed"] == []  # no blocks
    assert {"gpu_info", "memory_usage", "training_mode"} <= setup_info.keys()

    dataloader = DataLoader(digits(), batch_size=setup_info["optimal_batch_size"])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    before = [p.detach().clone() for p in model.parameters()]
    training_stats = training_system.training_loop(
        model=model,
        train_loader=dataloader,
        criterion=criterion,
        optimizer=optimizer,
        num_epochs=2,
    )
    training_system.cleanup()

    assert training_stats["epochs_completed"] == 2 and training_stats["global_step"] == 8
    losses = training_stats["train_losses"]
    assert len(losses) == 2 and losses[1] < losses[0]
    assert training_stats["precision"] == "fp16"
    assert Path(training_stats["run_dir"]).parent.parent == tmp_path
    assert "memory_allocated_mean" in training_stats["gpu_summary"]
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert training_system.last_run is None


def test_gpu_config_maps_onto_the_config_tree(tmp_path: Path) -> None:
    gpu_config = GPUConfig(
        device_ids=[0, 1],
        memory_fraction=0.95,
        enable_data_parallel=True,
        enable_distributed=False,
        pin_memory=False,
        num_workers=8,
        prefetch_factor=4,
        persistent_workers=False,
        enable_gradient_checkpointing=True,
        enable_mixed_precision=False,
    )
    system = IntegratedGPUTrainingSystem(gpu_config, log_dir=tmp_path, progress=False)
    tree = system.training_config(Blocks())
    assert tree.hardware.memory_fraction == 0.95
    assert list(tree.distributed.device_ids or []) == [0, 1]
    assert tree.distributed.enable_data_parallel and not tree.distributed.enable_distributed
    loader = tree.data.loader
    assert (loader.pin_memory, loader.num_workers, loader.prefetch_factor) == (False, 8, 4)
    assert loader.persistent_workers is False
    assert tree.precision.enable_amp is False  # either switch turns AMP off
    assert tree.transforms.activation_checkpointing is True
    # A model without repeated blocks trains as it is instead of failing the build.
    assert system.training_config(make_model()).transforms.activation_checkpointing is False
    assert tree.run.log_dir == tmp_path


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        ("memory_fraction", 1.5, r"memory_fraction=1\.5 is invalid; allowed: None or a number"),
        ("num_workers", -2, r"num_workers=-2 is invalid"),
        ("device_ids", [-1], r"device_ids=\[-1\] is invalid"),
        ("pin_memory", "yes", r"pin_memory='yes' is invalid"),
    ],
)
def test_gpu_config_errors_name_the_field(field: str, value: Any, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        GPUConfig(**{field: value})


def test_gpu_config_is_frozen_and_replaced_instead() -> None:
    gpu_config = GPUConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu_config.enable_gradient_checkpointing = True  # type: ignore[misc]
    assert dataclasses.replace(gpu_config, enable_gradient_checkpointing=True) != gpu_config


def test_gpu_manager_snippet() -> None:
    gpu_config = GPUConfig(device_ids=[0], memory_fraction=0.9, enable_mixed_precision=True)
    gpu_manager = GPUManager(gpu_config)

    gpu_info = gpu_manager.get_gpu_info()
    assert isinstance(gpu_info["device_name"], str) and gpu_info["device_name"]
    assert gpu_info["total_memory"] / (1024**3) > 0
    assert gpu_info["host"] is (not torch.cuda.is_available())
    memory_usage = gpu_manager.get_memory_usage()
    assert memory_usage["allocated_gb"] >= 0.0

    model = Blocks()
    optimized_model = gpu_manager.optimize_model_for_gpu(model)
    assert optimized_model is model
    assert next(model.parameters()).device.type == gpu_manager.device.type
    assert gpu_manager.last_optimization is not None
    assert gpu_manager.last_optimization["activation_checkpointed"] == []  # not enabled

    checkpointing = GPUManager(GPUConfig(enable_gradient_checkpointing=True))
    checkpointing.optimize_model_for_gpu(model)
    assert checkpointing.last_optimization is not None
    assert checkpointing.last_optimization["activation_checkpointed"] == ["blocks.0", "blocks.1"]
    gpu_manager.clear_memory()


def test_gpu_memory_optimizer_snippet() -> None:
    model, input_shape = make_model(features=16), (8, 16)
    memory_optimizer = GPUMemoryOptimizer()

    optimized_model = memory_optimizer.optimize_model_memory(model, input_shape)
    assert optimized_model is model
    optimal_batch_size = memory_optimizer.optimize_batch_size(
        model, input_shape, target_memory_gb=8.0
    )
    assert optimal_batch_size == 4096  # a tiny model: the search's own bound
    memory_profile = memory_optimizer.profile_memory_usage(model, input_shape)
    assert sorted(memory_profile) == [1, 2, 4, 8]
    for _batch_size, profile in memory_profile.items():
        assert profile["memory_used_gb"] is not None and profile["memory_used_gb"] > 0


def test_gpu_performance_monitor_snippet() -> None:
    monitor = GPUPerformanceMonitor()
    monitor.start_monitoring(interval=0.02)
    deadline = time.monotonic() + 30.0  # a bound for a stuck thread, not a timing claim
    seen: list[dict[str, Any]] = []
    while len(seen) < 2 and time.monotonic() < deadline:
        metrics = monitor.get_latest_metrics()
        if metrics and (not seen or metrics["timestamp"] != seen[-1]["timestamp"]):
            seen.append(metrics)
        time.sleep(0.01)
    monitor.stop_monitoring()
    history = monitor.get_metrics_history()

    assert len(seen) == 2
    for metrics in seen:
        assert metrics.keys() >= SEED_METRICS
        assert metrics["memory_allocated_gb"] > 0
        if not torch.cuda.is_available():
            assert metrics["gpu_utilization"] is None and metrics["source"] == "psutil"
            assert metrics["temperature"] is None and metrics["memory_reserved_gb"] is None
    assert len(history) >= 2 and history[-1]["timestamp"] >= seen[-1]["timestamp"]
    assert len(monitor.get_metrics_history()) == len(history)  # stopped: no more samples
    summary = monitor.get_gpu_summary()
    assert summary["samples"] == len(history) and summary["memory_allocated_max"] > 0


def training_loop_args() -> dict[str, Any]:
    model = make_model()
    return {
        "model": model,
        "train_loader": [(torch.randn(4, 8), torch.tensor([0, 1, 0, 1]))],
        "criterion": nn.CrossEntropyLoss(),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "num_epochs": 1,
    }


def test_training_loop_inside_a_running_loop_says_what_to_do(tmp_path: Path) -> None:
    system = IntegratedGPUTrainingSystem(log_dir=tmp_path, progress=False)

    async def train_from_async_code() -> None:
        system.training_loop(**training_loop_args())

    with pytest.raises(RuntimeError, match=r"inside the running asyncio event loop.*await"):
        asyncio.run(train_from_async_code())
    with pytest.raises(RuntimeError, match=r"inside the running trio event loop"):
        trio.run(train_from_async_code)
    assert not list(tmp_path.iterdir())  # nothing was started


def test_mixed_precision_trainer_snippet() -> None:
    # Seed 000's four per-batch calls (the per-batch face is core.mixed_precision_training's).
    model, criterion = make_model(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data, targets = torch.randn(16, 8), torch.randint(0, 2, (16,))
    config = MixedPrecisionConfig(enabled=True, dtype="float16", loss_scaling=True)
    trainer = MixedPrecisionTrainer(config)
    before = [p.detach().clone() for p in model.parameters()]

    predictions = trainer.forward_pass(model, data)
    loss = trainer.compute_loss(criterion, predictions, targets)
    trainer.backward_pass(loss, optimizer)
    trainer.optimizer_step(optimizer)

    assert predictions.shape == (16, 2)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

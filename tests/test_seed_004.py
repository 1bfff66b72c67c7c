"""Seed 004's remaining snippets, run as written (adapted only where the seed is pseudo-code
or needs GPUs): the quick start, automatic detection, GPU monitoring, the trainer's own
``train()``, the performance summary, ``benchmark_performance``, ``get_optimal_batch_size``
and the troubleshooting recipes (mixed precision with a smaller batch, gradient
checkpointing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from core.errors import ConfigError
from core.multi_gpu_training import (
    MultiGPUConfig,
    create_multi_gpu_trainer,
    optimize_model_for_multi_gpu,
)
from core.optimized_training_optimizer import create_optimized_training_optimizer
from tests.helpers import make_classification, make_model

pytestmark = pytest.mark.anyio


class Blocks(nn.Module):
    """Repeated composite blocks: what gradient checkpointing applies to."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2)))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.layers(x))
        return out


def seed_config() -> MultiGPUConfig:
    return MultiGPUConfig(
        training_mode="auto",
        enable_data_parallel=True,
        enable_distributed=False,
        enable_gpu_monitoring=True,
    )


def snapshot(optimizer: Any) -> tuple[list[torch.Tensor], dict[str, Any]]:
    weights = [p.detach().clone() for p in optimizer.model.parameters()]
    state = {
        f"{i}.{k}": v.clone() if isinstance(v, torch.Tensor) else v
        for i, per_param in enumerate(optimizer.optimizer.state.values())
        for k, v in per_param.items()
    }
    return weights, state


def same(a: tuple[list[torch.Tensor], dict[str, Any]], b: Any) -> bool:
    weights_equal = all(torch.equal(x, y) for x, y in zip(a[0], b[0], strict=True))
    states_equal = a[1].keys() == b[1].keys() and all(
        torch.equal(v, b[1][k]) if isinstance(v, torch.Tensor) else v == b[1][k]
        for k, v in a[1].items()
    )
    return weights_equal and states_equal


async def test_quick_start_trains_then_benchmarks_without_changing_it(log_dir: Path) -> None:
    model = make_model()
    train_loader = DataLoader(make_classification(128), batch_size=32)
    val_loader = DataLoader(make_classification(64, seed=1), batch_size=64)
    multi_gpu_config = seed_config()
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=train_loader,
        val_loader=val_loader,
        multi_gpu_config=multi_gpu_config,
        max_epochs=1,
        learning_rate=0.001,
        log_dir=log_dir,
        progress=False,
    )
    results = await optimizer.train()
    assert results.epochs_completed == 1 and results.global_step == 4

    performance_summary = optimizer.multi_gpu_trainer.get_performance_summary()
    assert performance_summary["samples"] == 128 and performance_summary["throughput"] > 0
    assert performance_summary["throughput"] == performance_summary["samples_per_s"]
    if not torch.cuda.is_available():
        assert performance_summary["memory_efficiency"] is None
        assert "no CUDA device" in performance_summary["memory_efficiency_note"]
    else:
        assert 0 < performance_summary["memory_efficiency"] <= 1

    before = snapshot(optimizer)
    scale = optimizer.mixed_precision.precision.state_dict()
    benchmark_results = optimizer.benchmark_performance(num_iterations=5)
    assert same(before, snapshot(optimizer))  # weights and Adam's moments as they were
    assert optimizer.mixed_precision.precision.state_dict() == scale
    assert all(p.grad is None for p in optimizer.model.parameters())
    for key in ("average_forward_time", "average_backward_time", "average_optimizer_time"):
        assert benchmark_results[key] > 0
    assert benchmark_results["iterations"] == 5 and benchmark_results["batch_size"] == 32
    assert benchmark_results["samples_per_second"] > 0
    assert benchmark_results["precision"] == optimizer.mixed_precision.precision.name
    with pytest.raises(ConfigError, match=r"num_iterations=0 is invalid"):
        optimizer.benchmark_performance(num_iterations=0)
    optimizer.close()


def test_get_optimal_batch_size_is_a_share_of_the_device_memory(log_dir: Path) -> None:
    optimizer = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=DataLoader(make_classification(64), batch_size=16),
        multi_gpu_config=seed_config(),
        log_dir=log_dir,
        progress=False,
        max_batch_size=256,
    )
    before = snapshot(optimizer)
    optimal_batch_size = optimizer.get_optimal_batch_size(target_memory_usage=0.8)
    assert optimal_batch_size == 256  # a tiny model fits up to the search's bound
    assert same(before, snapshot(optimizer))
    with pytest.raises(ConfigError, match=r"target_memory_usage=1\.5 is invalid"):
        optimizer.get_optimal_batch_size(target_memory_usage=1.5)
    optimizer.close()


def test_automatic_gpu_detection() -> None:
    optimized_model, trainer = optimize_model_for_multi_gpu(
        model=make_model(),
        training_mode="auto",
        enable_data_parallel=True,
        enable_distributed=False,
    )
    training_info = trainer.get_training_info()
    count = torch.cuda.device_count()
    assert training_info["gpu_info"]["device_count"] == count
    expected = {0: "cpu", 1: "single_gpu"}.get(count, "data_parallel")
    assert training_info["training_mode"] == expected
    assert isinstance(optimized_model, nn.DataParallel) is (expected == "data_parallel")


def test_gpu_monitoring_snippet() -> None:
    config = MultiGPUConfig(training_mode="auto", enable_gpu_monitoring=True)
    trainer = create_multi_gpu_trainer(config=config)

    gpu_info = trainer.gpu_monitor.get_gpu_info()
    assert gpu_info["device_count"] == torch.cuda.device_count()
    assert "current_device" in gpu_info
    for device_info in gpu_info["devices"].values():
        assert device_info["total_memory"] / 1024**3 > 0 and device_info["capability"]

    for _ in range(3):
        trainer.record_gpu_metrics()
    summary = trainer.gpu_monitor.get_gpu_summary()
    assert summary["samples"] == 3
    assert summary["memory_allocated_mean"] / 1024**3 > 0
    assert summary["memory_allocated_max"] >= summary["memory_allocated_mean"]
    trainer.cleanup()
    assert trainer.gpu_monitor.get_gpu_summary()["samples"] == 0  # a new, empty history


async def test_the_trainer_trains_the_model_and_loader_it_prepared(log_dir: Path) -> None:
    trainer = create_multi_gpu_trainer(config=MultiGPUConfig(training_mode="auto"))
    with pytest.raises(RuntimeError, match=r"call it first"):
        await trainer.train()
    model = make_model()
    train_loader = trainer.setup_dataloader(make_classification(96), batch_size=32, num_workers=0)
    optimized_model = trainer.initialize_training(model)
    before = [p.detach().clone() for p in model.parameters()]

    results = await trainer.train(max_epochs=1, log_dir=log_dir, progress=False)

    assert results.epochs_completed == 1 and results.global_step == len(train_loader) == 3
    summary = trainer.get_performance_summary()
    assert summary["samples"] == 96 and summary["epochs"] == 1 and summary["throughput"] > 0
    assert trainer.strategy.unwrap(optimized_model) is model
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    trainer.cleanup()


async def test_troubleshooting_mixed_precision_with_a_smaller_batch(log_dir: Path) -> None:
    model = make_model()
    forward_sizes: list[int] = []
    model.register_forward_pre_hook(lambda module, args: forward_sizes.append(len(args[0])))
    config = MultiGPUConfig(training_mode="auto", enable_data_parallel=True)
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(make_classification(128), batch_size=64),
        multi_gpu_config=config,
        enable_mixed_precision=True,
        batch_size=32,  # reduced
        log_dir=log_dir,
        progress=False,
        max_epochs=1,
    )
    assert optimizer.describe()["model_setup"]["micro_batch_size"] == 32
    assert optimizer.config.precision.enable_amp is True
    results = await optimizer.train()
    optimizer.close()

    assert forward_sizes == [32] * 4  # two 64-sample batches, each in two micro-batches
    records = [json.loads(line) for line in (results.run_dir / "events.jsonl").open()]
    steps = [r for r in records if r["event"] == "train_step"]
    assert [r["samples"] for r in steps] == [64, 64]  # the optimizer step still sees 64


def test_troubleshooting_gradient_checkpointing(log_dir: Path) -> None:
    config = MultiGPUConfig(training_mode="auto", enable_gpu_monitoring=True)
    optimizer = create_optimized_training_optimizer(
        model=Blocks(),
        train_loader=DataLoader(make_classification(64), batch_size=32),
        multi_gpu_config=config,
        enable_mixed_precision=True,
        enable_gradient_checkpointing=True,
        log_dir=log_dir,
        progress=False,
    )
    assert optimizer.describe()["model_setup"]["activation_checkpointed"] == [
        "layers.0",
        "layers.1",
    ]
    optimizer.close()


def test_the_performance_optimizer_applies_what_a_run_would_and_the_run_keeps_it(
    log_dir: Path,
) -> None:
    # Seed 004's "works with PerformanceOptimizer": for a loop of one's own, or before a run.
    import anyio

    from core import PerformanceOptimizer
    from core.data import LoaderConfig, auto_num_workers
    from tests.test_data_rebuild import Decoded

    performance = PerformanceOptimizer(loader=LoaderConfig(num_workers=2))
    hardware = performance.detect_hardware()
    assert hardware["device"] == "cpu" and hardware["host"] is True  # this suite's CPU
    assert hardware["auto_precision"] == "fp32"  # dtype="auto" on a CPU
    assert hardware["auto_num_workers"] == auto_num_workers(torch.device("cpu"))
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))
    assert performance.optimize_model(conv) is conv
    assert performance.get_optimization_summary()["model"]["channels_last"] is False  # CPU
    dataset = Decoded()
    loader = performance.optimize_dataloader(DataLoader(dataset, batch_size=16, shuffle=True))
    kept = performance.optimize_dataloader(DataLoader(make_classification(32), batch_size=16))
    assert isinstance(loader, DataLoader) and loader.num_workers == 2
    assert isinstance(kept, DataLoader) and kept.num_workers == 0
    assert performance.loaders == [
        {
            "rebuilt": True,
            "num_workers": 2,
            "prefetch_factor": 2,
            "pin_memory": False,
            "persistent_workers": False,
            "start_method": "fork",  # quick to start, in a training process too
        },
        {"rebuilt": False, "reason": "a TensorDataset: nothing to load in parallel"},
    ]
    run = create_optimized_training_optimizer(
        model=make_model(), train_loader=loader, max_epochs=1, log_dir=log_dir
    )
    anyio.run(run.train)
    assert run.global_step == 6 and dataset.in_process == 0  # loaded by the workers
    lines = (run.run_dir / "events.jsonl").read_text().splitlines()
    (start,) = [r for r in map(json.loads, lines) if r["event"] == "run_start"]
    assert start["loaders"]["train"] == {
        "rebuilt": False,
        "reason": "num_workers=2 was set on the loader",
    }

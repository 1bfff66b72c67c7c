"""The monitor and the bottleneck verdict inside real training runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import core.trainer.assembly.build
from core import MultiGPUConfig, create_optimized_training_optimizer
from core.monitoring.gpu_monitor import GPUMonitor
from tests.helpers import loaders, make_classification, make_model
from tests.test_gpu_monitor import FakeNvml


def run(log_dir: Path, **kwargs: Any) -> list[dict[str, Any]]:
    train, val = loaders(n=kwargs.pop("n", 2048))
    optimizer = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=kwargs.pop("train_loader", train),
        val_loader=val,
        max_epochs=2,
        log_dir=log_dir,
        monitor_interval_s=0.02,
        **kwargs,
    )
    results = anyio.run(optimizer.train)
    lines = (results.run_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def test_a_cpu_run_samples_the_host_and_lines_steps_up_with_it(log_dir: Path) -> None:
    log = run(log_dir)
    degraded = [r for r in log if r["event"] == "monitor_degraded"]
    assert len(degraded) == 1 and "no CUDA device" in degraded[0]["reason"]
    samples = [r for r in log if r["event"] == "gpu_sample"]
    assert samples and {s["source"] for s in samples} == {"psutil"}
    steps = [r for r in log if r["event"] == "train_step"]
    assert {"device_util_pct", "device_mem_used_bytes"} <= set(steps[-1])
    assert steps[-1]["device_mem_used_bytes"] > 0  # a sample had landed by the last step
    for end in (r for r in log if r["event"] == "epoch_end"):
        assert end["bottleneck"] in {"input_bound", "compute_bound", "underutilised"}
        assert 0.0 <= end["input_stall_fraction"] < 1.0 and end["bottleneck_advice"]


def test_monitoring_can_be_switched_off(log_dir: Path) -> None:
    log = run(log_dir, multi_gpu_config=MultiGPUConfig(enable_gpu_monitoring=False))
    assert not [r for r in log if r["event"] in ("gpu_sample", "monitor_degraded")]
    step = next(r for r in log if r["event"] == "train_step")
    assert step["device_util_pct"] is None and step["device_mem_used_bytes"] is None


def test_an_nvml_error_mid_run_degrades_and_training_finishes(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class FailingNvml(FakeNvml):
        def nvmlDeviceGetUtilizationRates(self, handle: tuple[str, int]) -> Any:
            if self.calls["nvmlDeviceGetUtilizationRates"] >= 3:
                self.fail = "nvmlDeviceGetUtilizationRates"  # the GPU falls off the bus
            return super().nvmlDeviceGetUtilizationRates(handle)

    fake = FailingNvml(devices=1)

    def monitor(*args: Any, **kwargs: Any) -> GPUMonitor:
        return GPUMonitor(*args, **(kwargs | {"device_indices": [0], "nvml": fake}))

    monkeypatch.setattr(core.trainer.assembly.build, "GPUMonitor", monitor)
    log = run(log_dir, n=4096)
    sources = [r["source"] for r in log if r["event"] == "gpu_sample"]
    assert sources[:2] == ["nvml", "nvml"] and sources[-1] == "psutil"
    (degraded,) = (r for r in log if r["event"] == "monitor_degraded")
    assert "GPU is lost" in degraded["reason"]
    assert log[-1]["event"] == "run_end" and log[-1]["status"] == "completed"
    assert fake.calls["nvmlShutdown"] == 1


class SlowData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self) -> None:
        self.data = make_classification(256)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.001)  # a slow decoder
        x, y = self.data[i]
        return x, y


def test_a_slow_loader_is_called_input_bound(log_dir: Path) -> None:
    log = run(log_dir, train_loader=DataLoader(SlowData(), batch_size=32))
    end = next(r for r in log if r["event"] == "epoch_end")
    assert end["bottleneck"] == "input_bound" and end["input_stall_fraction"] > 0.5
    assert "num_workers" in end["bottleneck_advice"]

"""The memory meter: live-storage tracking on CPU sees allocations, frees, views, backward
and optimizer state; the CUDA meter reads the allocator; budgets come from free memory."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.memory import (
    CpuMemoryMeter,
    CudaMemoryMeter,
    batch_maker_for_shape,
    meter_for,
    run_trial,
)
from core.memory import meter as meter_module

MB = 1_000_000


def test_a_known_allocation_shows_in_the_peak() -> None:
    reading = meter_for("cpu").measure(lambda: torch.empty(1_000_000))
    assert 4 * MB <= reading.peak_bytes - reading.start_bytes < 5 * MB
    assert reading.reserved_bytes is None


def test_views_count_once_and_freed_storages_are_released() -> None:
    def work() -> None:
        block = torch.empty(1_000_000)
        view, transposed = block.view(1000, 1000), block.view(1000, 1000).t()
        del block, view, transposed
        again = torch.empty(1_000_000)  # the first block is gone: the peak stays at 4 MB
        del again

    reading = meter_for("cpu").measure(work)
    assert 4 * MB <= reading.peak_bytes < 5 * MB


def test_resident_tensors_count_from_the_start_and_are_not_counted_twice() -> None:
    model = nn.Linear(1000, 1000)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    meter = meter_for("cpu")
    reading = meter.measure(lambda: model.weight.t().contiguous(), resident=model.parameters())
    assert reading.start_bytes == params
    # t() is a view of the weight (no new bytes); contiguous() copies it once.
    assert reading.peak_bytes - reading.start_bytes == model.weight.numel() * 4


def test_backward_ops_are_seen() -> None:
    model = nn.Linear(1000, 1000)
    loss = model(torch.randn(8, 1000)).sum()
    reading = meter_for("cpu").measure(loss.backward, resident=model.parameters())
    assert model.weight.grad is not None
    assert reading.peak_bytes - reading.start_bytes >= model.weight.numel() * 4


def test_a_training_step_with_adam_counts_parameters_grads_and_optimizer_state() -> None:
    model = nn.Linear(1000, 1000)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(16, 1000)

    def step() -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    reading = meter_for("cpu").measure(step, resident=model.parameters())
    assert reading.start_bytes == params
    assert reading.peak_bytes >= 4 * params  # parameters + gradients + exp_avg + exp_avg_sq


def test_the_peak_grows_linearly_with_the_batch_size_for_an_mlp() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    meter, make = meter_for("cpu"), batch_maker_for_shape((1, 64))
    peaks = [run_trial(model, make, n, meter=meter).peak_bytes or 0 for n in (512, 1024, 2048)]
    first, second = peaks[1] - peaks[0], peaks[2] - peaks[1]
    assert peaks[0] > 0 and first > 0 and second == pytest.approx(2 * first, rel=0.02)


def test_meters_are_chosen_by_device_without_touching_a_gpu() -> None:
    assert type(meter_for("cpu")) is CpuMemoryMeter
    assert type(meter_for(torch.device("cuda", 1))) is CudaMemoryMeter


def test_the_cpu_budget_is_available_memory_less_the_margin() -> None:
    meter = meter_for("cpu")
    full, half = meter.budget_default(0.0), meter.budget_default(0.5)
    assert full > 0 and half == pytest.approx(full / 2, rel=0.05)


def test_the_cpu_budget_falls_back_to_psutil_without_meminfo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    psutil = pytest.importorskip("psutil")
    monkeypatch.setattr(meter_module, "_MEMINFO", "/nonexistent/meminfo")
    budget = meter_for("cpu").budget_default(0.0)
    assert budget == pytest.approx(psutil.virtual_memory().available, rel=0.05)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_cuda_meter_reads_the_allocator() -> None:
    reading = meter_for("cuda").measure(lambda: torch.empty(1 << 20, device="cuda"))
    assert reading.peak_bytes - reading.start_bytes >= 4 << 20
    assert reading.reserved_bytes is not None and reading.reserved_bytes >= reading.start_bytes
    assert meter_for("cuda").budget_default(0.1) > 0

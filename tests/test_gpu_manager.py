"""DeviceManager: what apply() sets and reports, memory reports, config validation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from core.errors import ConfigError
from core.hardware.settings import DeviceManager, GPUManagerConfig

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def restore_backends() -> Iterator[None]:
    """apply() flips process-wide switches: put them back for the tests that follow."""
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
    )
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved[1:]


def test_on_cpu_apply_touches_nothing(restore_backends: None) -> None:
    benchmark = torch.backends.cudnn.benchmark
    manager = DeviceManager(GPUManagerConfig(cudnn_benchmark=not benchmark), torch.device("cpu"))
    report = manager.apply()
    assert report == {
        "cuda": False,
        "device": "cpu",
        "compute_capability": None,
        "tf32_matmul": None,
        "tf32_cudnn": None,
        "cudnn_benchmark": None,
        "memory_fraction": None,
        "applied": [],
    }
    assert torch.backends.cudnn.benchmark is benchmark


def test_on_cpu_memory_reports_are_safe() -> None:
    manager = DeviceManager(device="cpu")
    assert manager.get_memory_usage() == {
        "allocated_gb": 0.0,
        "reserved_gb": 0.0,
        "max_allocated_gb": 0.0,
    }
    manager.clear_memory()  # nothing to free, nothing raised
    info = manager.get_gpu_info()
    assert info["cuda"] is False and info["device_name"] is None and info["total_memory"] is None


@pytest.mark.parametrize(("capability", "tf32"), [((8, 0), True), ((7, 5), False)])
def test_tf32_only_on_ampere_and_newer(
    monkeypatch: pytest.MonkeyPatch,
    restore_backends: None,
    capability: tuple[int, int],
    tf32: bool,
) -> None:
    # A CPU build cannot reach the CUDA branch: only the capability and the memory cap are faked.
    fractions: list[tuple[float, int]] = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, i: fractions.append((f, i))
    )
    torch.set_float32_matmul_precision("highest")
    config = GPUManagerConfig(cudnn_benchmark=True, memory_fraction=0.5)
    report = DeviceManager(config, torch.device("cuda", 1)).apply()
    assert report["tf32_matmul"] is report["tf32_cudnn"] is tf32
    assert report["compute_capability"] == f"{capability[0]}.{capability[1]}"
    assert report["cudnn_benchmark"] is True and torch.backends.cudnn.benchmark is True
    assert report["memory_fraction"] == 0.5 and fractions == [(0.5, 1)]
    assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")
    expected = ["tf32_matmul", "tf32_cudnn"] if tf32 else []
    assert report["applied"] == [*expected, "cudnn_benchmark", "memory_fraction"]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"memory_fraction": 0}, r"memory_fraction=0 is invalid; allowed: None or a number"),
        ({"memory_fraction": 1.5}, r"memory_fraction=1\.5 is invalid"),
        ({"memory_fraction": True}, r"memory_fraction=True is invalid"),
        ({"tf32": "yes"}, r"tf32='yes' is invalid; allowed: True, False"),
        ({"cudnn_benchmark": 1}, r"cudnn_benchmark=1 is invalid"),
    ],
)
def test_config_errors_name_the_field(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        GPUManagerConfig(**fields)  # type: ignore[arg-type]


def test_a_full_memory_fraction_is_allowed() -> None:
    assert GPUManagerConfig(memory_fraction=1.0).memory_fraction == 1.0


@pytest.mark.gpu
@needs_cuda
def test_apply_on_a_real_gpu(restore_backends: None) -> None:
    manager = DeviceManager(GPUManagerConfig(tf32=True), torch.device("cuda", 0))
    report = manager.apply()
    ampere = torch.cuda.get_device_capability(0)[0] >= 8
    assert report["cuda"] is True and report["tf32_matmul"] is ampere
    assert torch.backends.cuda.matmul.allow_tf32 is ampere
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda:0")
    assert manager.get_memory_usage()["allocated_gb"] >= 64 / 1024
    del block
    manager.clear_memory()
    info = manager.get_gpu_info()
    assert info["device_name"] == torch.cuda.get_device_name(0) and info["total_memory"] > 0

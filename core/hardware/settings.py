"""``DeviceManager``: the one place that applies process-wide device settings, and reports on
the device and its memory. TF32, cuDNN autotuning and the allocator's memory cap are applied
here, so the run records exactly what was set (``apply()``'s report goes into ``run_start``).

Example::

    manager = DeviceManager(GPUManagerConfig(cudnn_benchmark=True), torch.device("cuda", 0))
    applied = manager.apply()   # {"cuda": True, "tf32_matmul": True, ...}
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any

import torch

from core.checks import check_bool_fields, is_number
from core.errors import config_error
from core.flat_keyword import flat
from core.hardware.device import device_of

__all__ = ("DeviceManager", "GPUManagerConfig")

_GIB = 1024**3
_AMPERE = 8  # TF32 tensor cores arrived with compute capability 8.0


@dataclass(frozen=True, kw_only=True)
class GPUManagerConfig:
    """``tf32``: let fp32 matmuls and convolutions use TF32 tensor cores (Ampere and newer;
    ~10 bits of mantissa, usually harmless for training). ``cudnn_benchmark``: autotune
    convolution algorithms (faster for fixed input shapes, slower when shapes vary).
    ``memory_fraction``: cap this process's share of device memory (None: no cap)."""

    tf32: bool = field(default=True, metadata=flat("tf32"))
    cudnn_benchmark: bool = field(default=False, metadata=flat("cudnn_benchmark"))
    memory_fraction: float | None = field(default=None, metadata=flat("memory_fraction"))

    def __post_init__(self) -> None:
        check_bool_fields(self)
        fraction = self.memory_fraction
        if fraction is not None and not (is_number(fraction) and 0 < fraction <= 1):
            raise config_error(
                "memory_fraction",
                fraction,
                "None or a number in (0, 1]",
                "e.g. 0.9 to leave 10% of the device to other processes",
            )


def _set_tf32(enabled: bool) -> None:
    # The long-standing switches, not torch >= 2.9's ``fp32_precision``: once that one is
    # written, code that reads the legacy ``allow_tf32`` flags raises.
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled


class DeviceManager:
    """Applies :class:`GPUManagerConfig` to ``device`` and reports on the device and its
    memory."""

    def __init__(
        self, config: GPUManagerConfig | None = None, device: torch.device | str | None = None
    ) -> None:
        self.config = config or GPUManagerConfig()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)

    @property
    def cuda(self) -> bool:
        return device_of(self.device).is_cuda

    def _index(self) -> int:
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def apply(self) -> dict[str, Any]:
        """Apply the settings; return what each setting is now and which were ``applied``.

        Off CUDA nothing is touched and every setting reads None.
        """
        report: dict[str, Any] = {
            "cuda": self.cuda,
            "device": str(self.device),
            "compute_capability": None,
            "tf32_matmul": None,
            "tf32_cudnn": None,
            "cudnn_benchmark": None,
            "memory_fraction": None,
            "applied": [],
        }
        if not self.cuda:
            return report
        config = self.config
        index = self._index()
        major, minor = torch.cuda.get_device_capability(index)
        report["compute_capability"] = f"{major}.{minor}"
        applied: list[str] = report["applied"]
        tf32 = config.tf32 and major >= _AMPERE
        if major >= _AMPERE:  # older GPUs have no TF32: nothing to switch
            _set_tf32(config.tf32)
            applied += ["tf32_matmul", "tf32_cudnn"]
        report["tf32_matmul"] = report["tf32_cudnn"] = tf32
        torch.backends.cudnn.benchmark = config.cudnn_benchmark
        report["cudnn_benchmark"] = config.cudnn_benchmark
        applied.append("cudnn_benchmark")
        if config.memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(config.memory_fraction, index)
            report["memory_fraction"] = config.memory_fraction
            applied.append("memory_fraction")
        return report

    def get_gpu_info(self) -> dict[str, Any]:
        """The device's ``device_name``, ``total_memory`` (bytes) and ``capability``, the device
        count and the CUDA and cuDNN versions (None where there is no CUDA)."""
        info: dict[str, Any] = {
            "cuda": self.cuda,
            "device": str(self.device),
            "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "device_name": None,
            "total_memory": None,
            "capability": None,
            "cuda_version": torch.version.cuda,
            "cudnn_version": None,
        }
        if self.cuda:
            props = torch.cuda.get_device_properties(self._index())
            info |= {
                "device_name": props.name,
                "total_memory": int(props.total_memory),
                "capability": (props.major, props.minor),
                "cudnn_version": torch.backends.cudnn.version(),
            }
        return info

    def get_memory_usage(self) -> dict[str, float]:
        """Allocator counters in GiB (no device sync); zeros off CUDA."""
        if not self.cuda:
            return {"allocated_gb": 0.0, "reserved_gb": 0.0, "max_allocated_gb": 0.0}
        index = self._index()
        return {
            "allocated_gb": torch.cuda.memory_allocated(index) / _GIB,
            "reserved_gb": torch.cuda.memory_reserved(index) / _GIB,
            "max_allocated_gb": torch.cuda.max_memory_allocated(index) / _GIB,
        }

    def clear_memory(self) -> None:
        """Collect garbage, then hand cached blocks back to the driver (for other processes;
        it does not make more memory available to this one)."""
        gc.collect()
        if self.cuda and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

"""What this machine has and what core recommends on it (``core-train info``): devices and
their capabilities, NVML, and the settings ``auto`` resolves to here."""

from __future__ import annotations

from typing import Any

import torch

from core.data import auto_num_workers, usable_cores
from core.distributed.config import MultiGPUConfig
from core.distributed.selection import Machine, resolve_mode
from core.errors import ConfigError
from core.hardware.device import device_of
from core.monitoring.nvml import load_nvml, nvml_acquire, nvml_release

__all__ = ("machine_info",)

_GIB = 2**30
_AMPERE = 8


def _nvml() -> dict[str, Any]:
    try:
        nvml = load_nvml()
        nvml_acquire(nvml)
    except Exception as exc:  # not installed, no driver: say why
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    try:
        return {"available": True, "devices": int(nvml.nvmlDeviceGetCount())}
    finally:
        nvml_release(nvml)


def machine_info() -> dict[str, Any]:
    """Devices, capabilities, NVML, and the settings ``auto`` resolves to on this machine."""
    cuda = torch.cuda.is_available()
    devices = []
    for index in range(torch.cuda.device_count() if cuda else 0):
        props = torch.cuda.get_device_properties(index)
        devices.append(
            {
                "index": index,
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_gb": round(props.total_memory / _GIB, 2),
                "bf16": props.major >= _AMPERE,
                "tf32": props.major >= _AMPERE,
                "tensor_cores": props.major >= 7,
            }
        )
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    try:
        mode, why = resolve_mode(MultiGPUConfig(), Machine.detect())
    except ConfigError as exc:
        mode, why = "unknown", [str(exc)]
    dtype = device_of(device).auto_dtype()
    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
    return {
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cpu_cores": usable_cores(),
        "devices": devices,
        "nvml": _nvml(),
        "recommended": {
            "device": str(device),
            "precision": names.get(dtype, str(dtype)),
            "training_mode": mode,
            "why": why,
            "num_workers": auto_num_workers(device),
            "compile": cuda,
            "channels_last": cuda,
        },
    }

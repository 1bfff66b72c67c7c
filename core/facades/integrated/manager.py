"""Seed 000's ``GPUManager``: the device settings of :class:`core.hardware.settings.DeviceManager`
from a :class:`GPUConfig`, a host report where there is no GPU, and the model placed and
made lighter for its device (``optimize_model_for_gpu``)."""

from __future__ import annotations

import platform
from typing import Any

import torch
from torch import nn
from typing_extensions import override

from core.errors import config_error
from core.facades.integrated.config import GPUConfig
from core.hardware.settings import DeviceManager, GPUManagerConfig
from core.transforms.activation_checkpointing import apply_activation_checkpointing, find_blocks
from core.transforms.channels_last import apply_channels_last, wants_channels_last

__all__ = ("GPUManager", "default_device")

_GIB = 1024**3
_CPUINFO = "/proc/cpuinfo"


def default_device(gpu_config: GPUConfig) -> torch.device:
    """The first of ``device_ids`` with CUDA, the current CUDA device without, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    ids = gpu_config.device_ids
    return torch.device("cuda", ids[0] if ids else torch.cuda.current_device())


def _cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        with open(_CPUINFO, encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _host_memory() -> tuple[int, int]:
    """This machine's RAM and this process's resident memory, in bytes (psutil)."""
    import psutil

    return int(psutil.virtual_memory().total), int(psutil.Process().memory_info().rss)


class GPUManager(DeviceManager):
    """Device settings and reports for one device; without CUDA the reports describe the
    host.

    Example::

        gpu_manager = GPUManager(GPUConfig(memory_fraction=0.9))
        gpu_manager.get_memory_usage()["allocated_gb"]
    """

    def __init__(
        self,
        gpu_config: GPUConfig | GPUManagerConfig | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if gpu_config is not None and not isinstance(gpu_config, (GPUConfig, GPUManagerConfig)):
            raise config_error(
                "gpu_config",
                gpu_config,
                "a GPUConfig, a GPUManagerConfig or None",
                "pass GPUConfig(device_ids=[0], memory_fraction=0.9).",
            )
        seed = gpu_config if isinstance(gpu_config, GPUConfig) else GPUConfig()
        settings = gpu_config if isinstance(gpu_config, GPUManagerConfig) else None
        super().__init__(settings or seed.manager_config(), device or default_device(seed))
        self.gpu_config = seed
        self.last_optimization: dict[str, Any] | None = None

    @override
    def get_gpu_info(self) -> dict[str, Any]:
        """The seed keys; without CUDA the CPU's name, the RAM and ``"host": True``."""
        info = super().get_gpu_info() | {"host": not self.cuda}
        if not self.cuda:
            total, _rss = _host_memory()
            info |= {"device_name": _cpu_name(), "total_memory": total}
        return info

    @override
    def get_memory_usage(self) -> dict[str, float]:
        """GiB from torch's allocator counters (no device sync); without CUDA, this
        process's resident memory, ``reserved_gb`` 0."""
        if self.cuda:
            return super().get_memory_usage()
        _total, rss = _host_memory()
        return {"allocated_gb": rss / _GIB, "reserved_gb": 0.0, "max_allocated_gb": rss / _GIB}

    def optimize_model_for_gpu(self, model: nn.Module) -> nn.Module:
        """:meth:`apply` the device settings, then move ``model`` there, checkpoint its
        repeated blocks (``enable_gradient_checkpointing``) and make a CNN channels_last on
        CUDA, in place; what was done is kept in ``last_optimization``."""
        settings = self.apply()
        model.to(self.device)
        checkpointed: list[str] = []
        if self.gpu_config.enable_gradient_checkpointing and find_blocks(model):
            checkpointed = apply_activation_checkpointing(model)
        channels_last = wants_channels_last("auto", model, self.device)
        if channels_last:
            apply_channels_last(model)
        self.last_optimization = {
            "device": str(self.device),
            "device_settings": settings,
            "activation_checkpointed": checkpointed,
            "channels_last": channels_last,
        }
        return model

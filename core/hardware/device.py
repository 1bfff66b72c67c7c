"""Allocator memory counters for step records, read without a device sync."""

from __future__ import annotations

import torch

__all__ = ("DeviceMemory", "device_memory")


class DeviceMemory:
    """Devices without allocator statistics (CPU): the fields are null."""

    def allocated(self) -> int | None:
        return None

    def max_allocated(self) -> int | None:
        return None


class CudaMemory(DeviceMemory):
    """``torch.cuda`` allocator counters (host-side bookkeeping; no synchronisation)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def allocated(self) -> int | None:
        return torch.cuda.memory_allocated(self.device)

    def max_allocated(self) -> int | None:
        return torch.cuda.max_memory_allocated(self.device)


def device_memory(device: torch.device) -> DeviceMemory:
    return CudaMemory(device) if device.type == "cuda" else DeviceMemory()

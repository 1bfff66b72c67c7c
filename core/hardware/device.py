"""The device a run computes on, as one small object: what differs between CPU and CUDA is
asked here (memory counters, the cache, bf16 support, current device), not in
``device.type == "cuda"`` checks spread over the package.
"""

from __future__ import annotations

import torch

__all__ = ("CudaDevice", "Device", "device_of")


class Device:
    """A device without an accelerator's extras (CPU): counters are null, caches absent."""

    counts_allocations = False
    """Whether :meth:`allocated_and_peak` reads real counters (a caller may skip it)."""

    def __init__(self, device: torch.device) -> None:
        self.torch = device

    @property
    def is_cuda(self) -> bool:
        return False

    def indices(self) -> list[int]:
        """The CUDA device indices this is (for NVML and DDP's ``device_ids``); empty on CPU."""
        return []

    def make_current(self) -> None:
        """Make this the current device of the calling thread (CUDA only)."""

    def empty_cache(self) -> None:
        """Return cached allocator blocks to the device (after an out-of-memory error)."""

    def supports_bf16(self) -> bool:
        """CPU autocast runs bf16."""
        return True

    def auto_dtype(self) -> torch.dtype:
        """What ``dtype="auto"`` means here: fp32 on CPU (autocast there rarely pays)."""
        return torch.float32

    def allocated_and_peak(self) -> tuple[int | None, int | None]:
        """Allocator bytes in use and their peak, in one read of the allocator's counters
        (host-side bookkeeping, no sync); None without statistics."""
        return None, None

    def max_allocated(self) -> int | None:
        return self.allocated_and_peak()[1]

    def generators(self) -> tuple[torch.Generator, ...]:
        """The generators a forward draws from (dropout): torch's CPU one and, on CUDA, the
        device's (their ``get_state()`` is a host-side copy: no sync)."""
        return (torch.default_generator,)


class CudaDevice(Device):
    """A CUDA device: allocator counters, cache, current-device and bf16 queries."""

    counts_allocations = True

    @property
    def is_cuda(self) -> bool:
        return True

    def _index(self) -> int:
        return self.torch.index if self.torch.index is not None else torch.cuda.current_device()

    def indices(self) -> list[int]:
        return [self.torch.index if self.torch.index is not None else 0]

    def make_current(self) -> None:
        torch.cuda.set_device(self.torch)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def supports_bf16(self) -> bool:
        return bool(torch.cuda.is_bf16_supported())

    def auto_dtype(self) -> torch.dtype:
        """bf16 where supported (Ampere and newer), else fp16 with loss scaling."""
        return torch.bfloat16 if self.supports_bf16() else torch.float16

    def allocated_and_peak(self) -> tuple[int | None, int | None]:
        # One nested read: torch.cuda.memory_allocated() and max_memory_allocated() each
        # flatten every allocator counter in Python (~120), about 0.15 ms apiece.
        counters = torch.cuda.memory_stats_as_nested_dict(self.torch)
        allocated = counters.get("allocated_bytes", {}).get("all", {})
        return allocated.get("current", 0), allocated.get("peak", 0)

    def generators(self) -> tuple[torch.Generator, ...]:
        torch.cuda.init()  # fills torch.cuda.default_generators
        return (torch.default_generator, torch.cuda.default_generators[self._index()])


def device_of(device: torch.device | str) -> Device:
    """The device object for a torch device."""
    place = torch.device(device)
    return CudaDevice(place) if place.type == "cuda" else Device(place)

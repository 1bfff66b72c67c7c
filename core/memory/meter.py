"""Measuring the peak memory of a piece of work, on CUDA from the allocator's counters and on
CPU by tracking the tensor storages it creates (torch keeps no CPU allocator statistics).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from core.errors import config_error

__all__ = (
    "CpuMemoryMeter",
    "CudaMemoryMeter",
    "MemoryMeter",
    "MemoryReading",
    "meter_for",
)

_MEMINFO = "/proc/meminfo"


@dataclass(frozen=True)
class MemoryReading:
    """What one measured piece of work used: ``peak_bytes`` includes ``start_bytes``;
    ``reserved_bytes`` is the CUDA caching allocator's at the end (``None`` on CPU)."""

    peak_bytes: int
    start_bytes: int
    reserved_bytes: int | None


class MemoryMeter:
    """Measures the peak memory of a callable on one device (see the subclasses)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def measure(
        self, fn: Callable[[], object], *, resident: Iterable[torch.Tensor] = ()
    ) -> MemoryReading:
        """Run ``fn`` and report its peak; ``resident`` tensors (parameters, buffers) count
        as live from the start."""
        raise NotImplementedError

    def budget_default(self, margin: float) -> int:
        """The bytes a step may use when no target is given: free memory less ``margin``."""
        raise NotImplementedError


class CudaMemoryMeter(MemoryMeter):
    """The CUDA caching allocator's own counters (``max_memory_allocated``)."""

    def measure(
        self, fn: Callable[[], object], *, resident: Iterable[torch.Tensor] = ()
    ) -> MemoryReading:
        torch.cuda.reset_peak_memory_stats(self.device)
        start = torch.cuda.memory_allocated(self.device)
        fn()
        return MemoryReading(
            peak_bytes=torch.cuda.max_memory_allocated(self.device),
            start_bytes=start,
            reserved_bytes=torch.cuda.memory_reserved(self.device),
        )

    def budget_default(self, margin: float) -> int:
        """Free memory plus what torch's allocator holds (a peak counts it), less ``margin``."""
        free, _total = torch.cuda.mem_get_info(self.device)
        return int((free + torch.cuda.memory_reserved(self.device)) * (1.0 - margin))


class _LiveStorages(TorchDispatchMode):
    """Counts the bytes of live CPU storages: each op output's storage once, until freed."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        self.device = device
        self.live: dict[int, tuple[int, weakref.finalize[Any, Any]]] = {}
        self.current = 0
        self.peak = 0
        self._lock = threading.Lock()

    def track(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != self.device.type or tensor.layout != torch.strided:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
            return
        key, size = id(storage), storage.nbytes()
        with self._lock:
            if key in self.live:
                known, finalizer = self.live[key]
                if known == size:
                    return
                self.live[key] = (size, finalizer)  # resized in place (an ``out=`` op)
                self.current += size - known
            else:
                finalizer = weakref.finalize(storage, self._release, key)
                self.live[key] = (size, finalizer)
                self.current += size
            self.peak = max(self.peak, self.current)

    def _release(self, key: int) -> None:
        with self._lock:
            size, _finalizer = self.live.pop(key, (0, None))
            self.current -= size

    def detach(self) -> None:
        """Stop listening for frees (storages that outlive the measurement)."""
        with self._lock:
            for _size, finalizer in self.live.values():
                finalizer.detach()
            self.live.clear()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                self.track(leaf)
        return out


class CpuMemoryMeter(MemoryMeter):
    """Live-storage tracking on the calling thread (CPU autograd runs backward there too); a
    kernel's scratch space and memory outside torch are not seen."""

    def measure(
        self, fn: Callable[[], object], *, resident: Iterable[torch.Tensor] = ()
    ) -> MemoryReading:
        tracker = _LiveStorages(self.device)
        for tensor in resident:
            tracker.track(tensor)
        start = tracker.current
        try:
            with tracker:
                fn()
        finally:
            tracker.detach()
        return MemoryReading(peak_bytes=tracker.peak, start_bytes=start, reserved_bytes=None)

    def budget_default(self, margin: float) -> int:
        """``MemAvailable`` (else psutil's figure) less ``margin``."""
        return int(_available_host_bytes() * (1.0 - margin))


def _available_host_bytes() -> int:
    try:
        with open(_MEMINFO, encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception as exc:  # no psutil, or it cannot read this platform either
        raise config_error(
            "target_memory_gb",
            None,
            "a number of GiB > 0 (the free host memory could not be read: "
            f"{_MEMINFO} is unreadable and psutil failed with {type(exc).__name__})",
            "pass target_memory_gb explicitly, e.g. target_memory_gb=8.0.",
        ) from exc


def meter_for(device: torch.device | str) -> MemoryMeter:
    """The memory meter for ``device``: allocator counters on CUDA, tracking elsewhere."""
    place = torch.device(device)
    if place.type == "cuda":
        return CudaMemoryMeter(place)
    return CpuMemoryMeter(place)

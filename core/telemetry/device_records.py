"""The device monitor's records (part of the schema in ``core.telemetry.records``).

No ``from __future__ import annotations``: checks read annotations.
"""

from typing import Annotated, Literal

from core.telemetry.record_common import Common

__all__ = ("GpuSample", "MonitorDegraded", "MonitorFieldUnsupported")


class GpuSample(Common):
    """Every monitor_interval_s, one per monitored device (NVML, else the host via psutil)."""

    device: Annotated[int | str, "torch CUDA index, or cpu for a host sample"]
    source: Annotated[Literal["nvml", "psutil"], "where the numbers come from"]
    t_s: Annotated[float, "the monitor's monotonic clock, seconds"]
    util_pct: Annotated[float | None, "GPU busy percent; psutil: process CPU (100 per core)"]
    mem_util_pct: Annotated[float | None, "memory-controller busy percent; psutil: RAM used"]
    mem_used_bytes: Annotated[int | None, "device memory used; psutil: process RSS"]
    mem_total_bytes: Annotated[int | None, "device memory; psutil: host RAM"]
    temperature_c: Annotated[float | None, "GPU temperature, degrees Celsius"]
    power_w: Annotated[float | None, "power draw, watts"]
    power_limit_w: Annotated[float | None, "enforced power limit, watts"]
    sm_clock_mhz: Annotated[int | None, "SM clock, MHz"]
    mem_clock_mhz: Annotated[int | None, "memory clock, MHz"]
    throttle_reasons: Annotated[list[str] | None, "active clock throttle reasons"]
    torch_mem_allocated_bytes: Annotated[int | None, "torch allocator in use; null off CUDA"]
    torch_mem_reserved_bytes: Annotated[int | None, "torch allocator reserved; null off CUDA"]
    torch_max_mem_allocated_bytes: Annotated[int | None, "torch allocator peak; null off CUDA"]


class MonitorDegraded(Common):
    """Once, when the monitor samples the host instead (no NVML, driver or GPU; NVML failed)."""

    reason: Annotated[str, "why NVML cannot be used"]
    source: Annotated[Literal["psutil"], "where samples come from now"]


class MonitorFieldUnsupported(Common):
    """Once per device and counter the board does not support (the field stays null)."""

    device: Annotated[int, "torch CUDA index"]
    field: Annotated[str, "the gpu_sample field"]
    reason: Annotated[str, "NVML's message"]

"""A :class:`~core.monitoring.gpu_monitor.GPUMonitor`'s samples read back as flat metrics: each
sample's first device at the top, the devices' summed memory and mean utilisation summarised.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from core.monitoring.config import GPUMonitorConfig
from core.monitoring.device_metrics import spread
from core.monitoring.gpu_monitor import GPUMonitor

__all__ = ("FlatMetricsMonitor", "flat_metrics", "totals_summary")

_GIB = 1024**3
_SUMMARY = ("memory_allocated", "memory_reserved", "gpu_utilization")
_KEYS = (
    "device",
    "source",
    "gpu_utilization",
    "cpu_utilization",
    "memory_allocated_gb",
    "memory_reserved_gb",
    "memory_utilization",
    "temperature",
    "power_w",
    "timestamp",
)


def _gib(value: object) -> float | None:
    return value / _GIB if isinstance(value, (int, float)) else None


def _device_metrics(record: dict[str, Any], timestamp: float) -> dict[str, Any]:
    nvml = record["source"] == "nvml"
    used, total = record["mem_used_bytes"], record["mem_total_bytes"]
    if nvml and used is not None and total:
        memory_utilization = 100.0 * used / total
    else:
        memory_utilization = record["mem_util_pct"]
    return {
        "device": record["device"],
        "source": record["source"],
        "gpu_utilization": record["util_pct"] if nvml else None,
        "cpu_utilization": None if nvml else record["util_pct"],
        "memory_allocated_gb": _gib(_allocated(record)),
        "memory_reserved_gb": _gib(record["torch_mem_reserved_bytes"]),
        "memory_utilization": memory_utilization,
        "temperature": record["temperature_c"],
        "power_w": record["power_w"],
        "timestamp": timestamp,
    }


_WALL_CLOCK_OFFSET = time.time() - time.monotonic()


def flat_metrics(sample: dict[str, Any]) -> dict[str, Any]:
    """One :meth:`GPUMonitor.sample` as flat metrics: the first device's at the top, every
    device's in ``devices``.

    ``gpu_utilization``: percent (NVML; None without a GPU, where ``cpu_utilization`` is
    this process's CPU percent, 100 per busy core). ``memory_allocated_gb``: torch's
    allocated memory on CUDA, this process's resident memory without a GPU.
    ``memory_reserved_gb``: torch's reserved memory (None without CUDA).
    ``memory_utilization``: percent of the device's memory in use (NVML), of the host's RAM
    in use (psutil). ``temperature`` (°C) and ``power_w``: None where unknown.
    ``timestamp``: seconds since the epoch (``time.time()``).
    """
    # The monitor stamps samples with a monotonic clock: shift it onto the wall clock by one
    # offset per process, so a sample converted twice gets the same timestamp.
    timestamp = _WALL_CLOCK_OFFSET + sample["t_s"]
    devices = [_device_metrics(record, timestamp) for record in sample["devices"]]
    first = devices[0] if devices else dict.fromkeys(_KEYS)
    return {**first, "timestamp": timestamp, "devices": devices}


class FlatMetricsMonitor:
    """A :class:`~core.monitoring.gpu_monitor.GPUMonitor` (its own, or ``monitor``, e.g. a
    run's) read as flat metrics; it keeps the last ``config.history_size`` samples.
    ``device_indices``: torch CUDA indices (None: every visible device).

    Example::

        monitor = FlatMetricsMonitor()
        monitor.start_monitoring(interval=2.0)
        metrics = monitor.get_latest_metrics()    # see flat_metrics
        monitor.stop_monitoring()
        monitor.get_gpu_summary()["memory_allocated_mean"]
    """

    def __init__(
        self,
        config: GPUMonitorConfig | None = None,
        *,
        device_indices: Sequence[int] | None = None,
        monitor: GPUMonitor | None = None,
    ) -> None:
        self.monitor = monitor or GPUMonitor(config, device_indices=device_indices)

    def start_monitoring(self, interval: float = 2.0) -> None:
        """Sample now and then every ``interval`` seconds until :meth:`stop_monitoring`."""
        self.monitor.start_monitoring(interval)

    def stop_monitoring(self) -> None:
        """Stop sampling (waits for a sample in progress) and release NVML."""
        self.monitor.stop_monitoring()
        self.monitor.close()

    def record_gpu_metrics(self) -> dict[str, Any]:
        """Take one sample now into the history, as the monitor returns it; never raises."""
        return self.monitor.sample()

    def get_latest_metrics(self) -> dict[str, Any] | None:
        """The newest sample's metrics (:func:`flat_metrics`), or None before the first."""
        latest = self.monitor.get_latest_metrics()
        return None if latest is None else flat_metrics(latest)

    def get_metrics_history(self) -> list[dict[str, Any]]:
        """Every kept sample's metrics (:func:`flat_metrics`), oldest first."""
        return [flat_metrics(sample) for sample in self.monitor.get_metrics_history()]

    def get_gpu_info(self) -> dict[str, Any]:
        """:meth:`GPUMonitor.get_gpu_info`."""
        return self.monitor.get_gpu_info()

    def get_gpu_summary(self) -> dict[str, Any]:
        """:meth:`GPUMonitor.get_gpu_summary` (per device ``<field>_mean``/``_max``/``_min``)
        with the totals of :func:`totals_summary` at the top."""
        history = self.monitor.get_metrics_history()
        return self.monitor.get_gpu_summary() | totals_summary(history)

    def close(self) -> None:
        """Stop sampling and release NVML (idempotent)."""
        self.stop_monitoring()


def _allocated(record: dict[str, Any]) -> Any:
    allocated = record["torch_mem_allocated_bytes"]
    return allocated if allocated is not None else record["mem_used_bytes"]


def totals_summary(history: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """The devices' totals over ``history``, each ``_mean``/``_max``/``_min`` over the
    samples: ``memory_allocated`` and ``memory_reserved`` (bytes, a sample's devices summed)
    and ``gpu_utilization`` (percent, their mean); None where unknown in every sample.
    """
    series: dict[str, list[float]] = {name: [] for name in _SUMMARY}
    for sample in history:
        records = sample["devices"]
        values = {
            "memory_allocated": [_allocated(r) for r in records],
            "memory_reserved": [r["torch_mem_reserved_bytes"] for r in records],
            "gpu_utilization": [r["util_pct"] if r["source"] == "nvml" else None for r in records],
        }
        for name, per_device in values.items():
            if per_device and None not in per_device:
                total = sum(per_device)
                series[name].append(total / len(per_device) if name == "gpu_utilization" else total)
    summary: dict[str, float | None] = {}
    for name, xs in series.items():
        summary |= spread(name, xs)
    return summary

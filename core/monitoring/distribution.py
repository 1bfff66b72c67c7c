"""``MonitoredDistribution``: a run's :class:`~core.distributed.distribution.Distribution` with
a monitor of this rank's devices.
"""

from __future__ import annotations

from typing import Any, ClassVar

from core.distributed.distribution import Distribution
from core.monitoring.flat_metrics import FlatMetricsMonitor
from core.monitoring.gpu_monitor import GPUMonitor

__all__ = ("MonitoredDistribution",)


class MonitoredDistribution(Distribution):
    """A :class:`~core.distributed.distribution.Distribution` whose ``gpu_monitor`` samples this
    rank's devices (NVML, or psutil without GPUs) on request; inside a run it reads the run's
    own monitor (its samples are the run's ``gpu_sample`` records).

    Example::

        distribution = MonitoredDistribution(MultiGPUConfig(training_mode="auto"))
        distribution.record_gpu_metrics()    # kept in the monitor's history
        distribution.gpu_monitor.get_gpu_summary()["memory_allocated_mean"]
    """

    monitor_class: ClassVar[type[FlatMetricsMonitor]] = FlatMetricsMonitor
    """What :attr:`gpu_monitor` is (a subclass may name another reader of the same kind)."""
    _monitor: FlatMetricsMonitor | None = None
    _owns_monitor = False

    @property
    def gpu_monitor(self) -> FlatMetricsMonitor:
        """The monitor of this rank's devices (created on first use; NVML opens lazily)."""
        if self._monitor is None:
            indices = self.strategy.device_indices() or None
            self._monitor = self.monitor_class(device_indices=indices)
            self._owns_monitor = True
        return self._monitor

    def attach_monitor(self, monitor: GPUMonitor) -> None:
        """Read ``monitor`` (a run's) as :attr:`gpu_monitor`; its owner closes it."""
        self.release_monitor()
        self._monitor, self._owns_monitor = self.monitor_class(monitor=monitor), False

    def release_monitor(self) -> None:
        """Close the monitor this distribution created (idempotent; a later use reopens one)."""
        monitor, owned = self._monitor, self._owns_monitor
        self._monitor, self._owns_monitor = None, False
        if monitor is not None and owned:
            monitor.close()

    def record_gpu_metrics(self) -> dict[str, Any]:
        """Sample this rank's devices now into :attr:`gpu_monitor`'s history; never raises."""
        return self.gpu_monitor.record_gpu_metrics()

    def cleanup(self) -> None:
        """Tear down the process group this distribution created and close its own monitor."""
        super().cleanup()
        self.release_monitor()

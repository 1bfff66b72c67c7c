"""Seed 000's ``GPUPerformanceMonitor`` (and seed 004's ``trainer.gpu_monitor``): the flat
metrics of :class:`core.monitoring.flat_metrics.FlatMetricsMonitor` under the seed's name."""

from __future__ import annotations

from core.monitoring.flat_metrics import FlatMetricsMonitor

__all__ = ("GPUPerformanceMonitor",)


class GPUPerformanceMonitor(FlatMetricsMonitor):
    """Seed 000's monitor: a :class:`~core.monitoring.gpu_monitor.GPUMonitor` read under the
    seeds' flat metric names, sampled in a daemon thread after :meth:`start_monitoring`.

    Example::

        monitor = GPUPerformanceMonitor()
        monitor.start_monitoring(interval=2.0)
        metrics = monitor.get_latest_metrics()    # seed 000's keys
        monitor.stop_monitoring()
        monitor.get_gpu_summary()["memory_allocated_mean"]
    """

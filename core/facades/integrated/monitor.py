"""Seed 000's ``GPUPerformanceMonitor`` (and seed 004's ``trainer.gpu_monitor``): the flat
metrics of :class:`core.monitoring.flat_metrics.FlatMetricsMonitor` under the seed's name.
"""

from __future__ import annotations

from core.monitoring.flat_metrics import FlatMetricsMonitor

__all__ = ("GPUPerformanceMonitor",)


class GPUPerformanceMonitor(FlatMetricsMonitor):
    """Seed 000's monitor: a :class:`~core.monitoring.gpu_monitor.GPUMonitor` (its own, or
    ``monitor``, e.g. a run's) read under the seeds' flat metric names
    (:func:`~core.monitoring.flat_metrics.flat_metrics`); ``get_gpu_summary()`` adds seed
    004's totals (:func:`~core.monitoring.flat_metrics.totals_summary`). Samples are taken
    every ``interval`` seconds in a daemon thread after :meth:`start_monitoring`, or one at a
    time by :meth:`record_gpu_metrics`; the monitor keeps the last ``config.history_size``.

    ``device_indices``: torch CUDA indices (None: every visible device).

    Example::

        monitor = GPUPerformanceMonitor()
        monitor.start_monitoring(interval=2.0)
        metrics = monitor.get_latest_metrics()    # seed 000's keys
        monitor.stop_monitoring()
        monitor.get_gpu_summary()["memory_allocated_mean"]
    """

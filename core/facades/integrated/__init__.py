"""Seed 000's integrated GPU system, as components over the existing parts: ``GPUConfig``
and its place in the config tree, the seed's ``GPUManager`` and ``GPUPerformanceMonitor``,
``setup_training`` (device settings and the batch-size search), and seed 004's monitored
distribution. The facade, ``core.facades.gpu_utilization_mixed_precision_system``, adds training."""

from __future__ import annotations

from core.facades.integrated.config import GPUConfig, training_config
from core.facades.integrated.manager import GPUManager, default_device
from core.facades.integrated.monitor import GPUPerformanceMonitor
from core.facades.integrated.setup import setup_training
from core.facades.integrated.sync import running_event_loop
from core.monitoring.distribution import MonitoredDistribution
from core.monitoring.flat_metrics import flat_metrics, totals_summary

__all__ = (
    "GPUConfig",
    "GPUManager",
    "GPUPerformanceMonitor",
    "MonitoredDistribution",
    "default_device",
    "flat_metrics",
    "running_event_loop",
    "setup_training",
    "totals_summary",
    "training_config",
)

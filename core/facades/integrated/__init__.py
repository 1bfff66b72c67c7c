"""Seed 000's integrated GPU system, as components over the existing parts: ``GPUConfig``
and its place in the config tree, the seed's ``GPUManager`` and ``GPUPerformanceMonitor``,
``setup_training`` (device settings and the batch-size search), and seed 004's monitored
distribution. The facade, ``core.facades.gpu_utilization_mixed_precision_system``, adds training."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

# Each name's module loads when first asked for: importing one module of this package
# (a run imports a few) loads none of the others.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "GPUConfig": "core.facades.integrated.config",
        "GPUManager": "core.facades.integrated.manager",
        "GPUPerformanceMonitor": "core.facades.integrated.monitor",
        "MonitoredDistribution": "core.monitoring.distribution",
        "default_device": "core.facades.integrated.manager",
        "flat_metrics": "core.monitoring.flat_metrics",
        "running_event_loop": "core.facades.integrated.sync",
        "setup_training": "core.facades.integrated.setup",
        "totals_summary": "core.monitoring.flat_metrics",
        "training_config": "core.facades.integrated.config",
    },
)

"""The import path seed 000 names:
the names of :mod:`core.facades.gpu_utilization_mixed_precision_system`, re-exported.

Example::

    from core.gpu_utilization_mixed_precision_system import IntegratedGPUTrainingSystem
"""

from __future__ import annotations

from core.facades.gpu_utilization_mixed_precision_system import (
    GPUConfig,
    GPUManager,
    GPUMemoryOptimizer,
    GPUPerformanceMonitor,
    IntegratedGPUTrainingSystem,
    MixedPrecisionConfig,
    MixedPrecisionTrainer,
)

__all__ = (
    "GPUConfig",
    "GPUManager",
    "GPUMemoryOptimizer",
    "GPUPerformanceMonitor",
    "IntegratedGPUTrainingSystem",
    "MixedPrecisionConfig",
    "MixedPrecisionTrainer",
)

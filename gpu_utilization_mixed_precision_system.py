"""Seed 000's import path, ``from gpu_utilization_mixed_precision_system import ...``: the
names of :mod:`core.facades.gpu_utilization_mixed_precision_system`, re-exported.

Example::

    from gpu_utilization_mixed_precision_system import GPUConfig, IntegratedGPUTrainingSystem
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

"""The import path seeds 002 and 004 name:
the names of :mod:`core.facades.multi_gpu_training`, re-exported.

Example::

    from core.multi_gpu_training import create_multi_gpu_trainer
"""

from __future__ import annotations

from core.facades.multi_gpu_training import (
    Machine,
    MultiGPUConfig,
    MultiGPUTrainer,
    TrainingMode,
    create_multi_gpu_trainer,
    get_free_port,
    launch_distributed_training,
    optimize_model_for_multi_gpu,
    setup_distributed_environment,
)

__all__ = (
    "Machine",
    "MultiGPUConfig",
    "MultiGPUTrainer",
    "TrainingMode",
    "create_multi_gpu_trainer",
    "get_free_port",
    "launch_distributed_training",
    "optimize_model_for_multi_gpu",
    "setup_distributed_environment",
)

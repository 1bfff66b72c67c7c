"""core: an async-native PyTorch training orchestrator.

``await optimizer.train()`` runs a complete training job (mixed precision, gradient
accumulation, per-step JSON telemetry) from inside any asyncio or trio program::

    import anyio
    from core import create_optimized_training_optimizer

    optimizer = create_optimized_training_optimizer(model=model, train_loader=loader)
    results = anyio.run(optimizer.train)
"""

from __future__ import annotations

from core.checkpointing.checkpointer import CheckpointConfig
from core.config import TrainingConfig
from core.distributed.config import MultiGPUConfig
from core.errors import (
    BatchFormatError,
    CheckpointError,
    ConfigError,
    CoreError,
    DistributedTimeoutError,
    EmptyLoaderError,
    IncompatibleCheckpointError,
    LossFormatError,
    NonFiniteLossError,
    OutOfMemoryError,
    SignalReceived,
    TrainingStepError,
    UnsafeCheckpointError,
)
from core.loop.accumulation import GradientAccumulation, GradientAccumulationConfig
from core.loop.recovery import ErrorHandler, ErrorHandlerConfig
from core.multi_gpu_training import MultiGPUTrainer
from core.optimized_training_optimizer import (
    OptimizedTrainingOptimizer,
    create_optimized_training_optimizer,
)
from core.precision.policy import MixedPrecisionConfig, MixedPrecisionTrainer
from core.telemetry.events import EventStream
from core.trainer.results import TrainingResults

__version__ = "0.1.0"

__all__ = (
    "BatchFormatError",
    "CheckpointConfig",
    "CheckpointError",
    "ConfigError",
    "CoreError",
    "DistributedTimeoutError",
    "EmptyLoaderError",
    "ErrorHandler",
    "ErrorHandlerConfig",
    "IncompatibleCheckpointError",
    "NonFiniteLossError",
    "OutOfMemoryError",
    "SignalReceived",
    "TrainingStepError",
    "UnsafeCheckpointError",
    "EventStream",
    "GradientAccumulation",
    "GradientAccumulationConfig",
    "LossFormatError",
    "MixedPrecisionConfig",
    "MixedPrecisionTrainer",
    "MultiGPUConfig",
    "MultiGPUTrainer",
    "OptimizedTrainingOptimizer",
    "TrainingConfig",
    "TrainingResults",
    "create_optimized_training_optimizer",
)

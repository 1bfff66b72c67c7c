"""core: an async-native PyTorch training orchestrator.

``await run.train()`` runs a complete training job (mixed precision, gradient accumulation,
distribution, checkpoints, per-step JSON telemetry) from inside any asyncio or trio
program. Settings form one config tree; the seed factory maps flat keywords onto it::

    import anyio
    from core import OptimizedTrainingOptimizer, RunConfig, TrainingConfig

    async def main() -> None:
        config = TrainingConfig(run=RunConfig(max_epochs=3))
        async with OptimizedTrainingOptimizer(config, model=model, train_loader=loader) as run:
            results = await run.train()

    anyio.run(main)
"""

from __future__ import annotations

from core.callbacks import Callback, RunInfo
from core.checkpointing.config import CheckpointConfig
from core.checkpointing.lineage import CheckpointInfo, Checkpoints
from core.checkpointing.model_loading import load_model
from core.checkpointing.weights import LoadedWeights, load_weights
from core.config import (
    DataConfig,
    EarlyStoppingConfig,
    OptimConfig,
    RayConfig,
    RunConfig,
    TrainingConfig,
)
from core.console import ProgressBar, summarize_model
from core.data import CachedDataset, DevicePrefetcher, LoaderConfig, create_dataloader
from core.errors import (
    BatchFormatError,
    CheckpointError,
    ClusterStartTimeout,
    ConfigError,
    CoreError,
    DistributedTimeoutError,
    EmptyLoaderError,
    IncompatibleCheckpointError,
    LineageHeldError,
    LossFormatError,
    NonFiniteLossError,
    OutOfMemoryError,
    SignalReceived,
    TrainingProcessDied,
    TrainingStepError,
    UnevenLoadersError,
    UnsafeCheckpointError,
)
from core.facades.gpu_utilization_mixed_precision_system import (
    GPUConfig,
    GPUPerformanceMonitor,
    IntegratedGPUTrainingSystem,
)
from core.facades.gradient_accumulation import GradientAccumulation, GradientAccumulationConfig
from core.facades.mixed_precision_training import (
    LossScalerConfig,
    MixedPrecisionConfig,
    MixedPrecisionOptimizer,
    MixedPrecisionTrainer,
    check_amp_compatibility,
    create_mixed_precision_optimizer,
    create_mixed_precision_trainer,
)
from core.facades.multi_gpu_training import MultiGPUConfig, MultiGPUTrainer
from core.facades.optimized_training_optimizer import (
    OptimizedTrainingOptimizer,
    create_optimized_training_optimizer,
)
from core.factory import Factory
from core.hardware.heap import set_aside_import_heap
from core.hardware.settings import GPUManagerConfig
from core.loop.recovery import ErrorHandler, ErrorHandlerConfig
from core.losses import FocalLoss, Mixup, MixupCollate
from core.memory import (
    GPUMemoryOptimizer,
    MemoryConfig,
    optimize_batch_size,
    optimize_model_memory,
    profile_memory_usage,
)
from core.metrics import Accuracy, F1Score, MeanAbsoluteError, MeanOf, Metric, Perplexity
from core.moe import ExpertGroup, MoELayer, auxiliary_loss
from core.monitoring.config import GPUMonitorConfig
from core.reports import write_reports
from core.reports.apart import wait_for_reports
from core.rng import seed_everything
from core.telemetry.config import LoggingConfig
from core.telemetry.events import EventStream
from core.trackers import (
    CSVLogger,
    MLflowLogger,
    TensorBoardLogger,
    Tracker,
    TrackerUnavailableError,
    WandbLogger,
)
from core.trainer.state.results import TrainingResults
from core.transforms import ModelTransformsConfig
from core.tuning import LRFinderResult, find_learning_rate

__version__ = "0.1.0"

__all__ = (
    "Accuracy",
    "BatchFormatError",
    "CSVLogger",
    "CachedDataset",
    "Callback",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointInfo",
    "Checkpoints",
    "ClusterStartTimeout",
    "ConfigError",
    "CoreError",
    "DataConfig",
    "DevicePrefetcher",
    "DistributedTimeoutError",
    "EarlyStoppingConfig",
    "EmptyLoaderError",
    "ErrorHandler",
    "ErrorHandlerConfig",
    "EventStream",
    "ExpertGroup",
    "F1Score",
    "Factory",
    "FocalLoss",
    "GPUConfig",
    "GPUManagerConfig",
    "GPUMemoryOptimizer",
    "GPUMonitorConfig",
    "GPUPerformanceMonitor",
    "GradientAccumulation",
    "GradientAccumulationConfig",
    "IncompatibleCheckpointError",
    "IntegratedGPUTrainingSystem",
    "LRFinderResult",
    "LineageHeldError",
    "LoadedWeights",
    "LoaderConfig",
    "LoggingConfig",
    "LossFormatError",
    "LossScalerConfig",
    "MLflowLogger",
    "MeanAbsoluteError",
    "MeanOf",
    "MemoryConfig",
    "Metric",
    "MixedPrecisionConfig",
    "MixedPrecisionOptimizer",
    "MixedPrecisionTrainer",
    "Mixup",
    "MixupCollate",
    "MoELayer",
    "ModelTransformsConfig",
    "MultiGPUConfig",
    "MultiGPUTrainer",
    "NonFiniteLossError",
    "OptimConfig",
    "OptimizedTrainingOptimizer",
    "OutOfMemoryError",
    "Perplexity",
    "ProgressBar",
    "RayConfig",
    "RunConfig",
    "RunInfo",
    "SignalReceived",
    "TensorBoardLogger",
    "Tracker",
    "TrackerUnavailableError",
    "TrainingConfig",
    "TrainingProcessDied",
    "TrainingResults",
    "TrainingStepError",
    "UnevenLoadersError",
    "UnsafeCheckpointError",
    "WandbLogger",
    "auxiliary_loss",
    "check_amp_compatibility",
    "create_dataloader",
    "create_mixed_precision_optimizer",
    "create_mixed_precision_trainer",
    "create_optimized_training_optimizer",
    "find_learning_rate",
    "load_model",
    "load_weights",
    "optimize_batch_size",
    "optimize_model_memory",
    "profile_memory_usage",
    "seed_everything",
    "summarize_model",
    "wait_for_reports",
    "write_reports",
)

set_aside_import_heap()  # last: torch and core are loaded (see core.hardware.heap)

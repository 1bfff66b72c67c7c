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

``import core`` loads what a run uses; the other public names (trackers, reports, tuning,
experts, memory tools, the founding facades' extras) load when first asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
from core.data.config import LoaderConfig
from core.distributed.config import MultiGPUConfig
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
from core.facades.optimized_training_optimizer import (
    OptimizedTrainingOptimizer,
    create_optimized_training_optimizer,
)
from core.factory import Factory
from core.hardware.heap import set_aside_import_heap
from core.hardware.settings import GPUManagerConfig
from core.lazy_exports import lazy_exports
from core.loop.accumulation import GradientAccumulationConfig
from core.loop.recovery import ErrorHandler, ErrorHandlerConfig
from core.memory.config import MemoryConfig
from core.monitoring.config import GPUMonitorConfig
from core.precision.compatibility import check_amp_compatibility
from core.precision.config import LossScalerConfig, MixedPrecisionConfig
from core.rng import seed_everything
from core.telemetry.config import LoggingConfig
from core.telemetry.events import EventStream
from core.trainer.state.results import TrainingResults
from core.transforms.config import ModelTransformsConfig

if TYPE_CHECKING:
    from core.console.model_summary import summarize_model
    from core.console.progress import ProgressBar
    from core.data.cache import CachedDataset
    from core.data.loader import create_dataloader
    from core.data.prefetch import DevicePrefetcher
    from core.facades.gpu_utilization_mixed_precision_system import (
        GPUConfig,
        GPUPerformanceMonitor,
        IntegratedGPUTrainingSystem,
    )
    from core.facades.gradient_accumulation import GradientAccumulation
    from core.facades.mixed_precision_training import (
        MixedPrecisionOptimizer,
        MixedPrecisionTrainer,
        create_mixed_precision_optimizer,
        create_mixed_precision_trainer,
    )
    from core.facades.multi_gpu_training import MultiGPUTrainer
    from core.facades.performance_optimizer import PerformanceOptimizer
    from core.losses.focal import FocalLoss
    from core.losses.mixup import Mixup, MixupCollate
    from core.memory.finder import optimize_batch_size
    from core.memory.optimizer import GPUMemoryOptimizer, optimize_model_memory
    from core.memory.profile import profile_memory_usage
    from core.metrics.base import MeanOf, Metric
    from core.metrics.classification import Accuracy, F1Score
    from core.metrics.language import Perplexity
    from core.metrics.regression import MeanAbsoluteError
    from core.moe.experts import ExpertGroup
    from core.moe.layer import MoELayer
    from core.moe.probe import auxiliary_loss
    from core.reports import write_reports
    from core.reports.apart import wait_for_reports
    from core.trackers.base import Tracker, TrackerUnavailableError
    from core.trackers.csv import CSVLogger
    from core.trackers.mlflow import MLflowLogger
    from core.trackers.tensorboard import TensorBoardLogger
    from core.trackers.wandb import WandbLogger
    from core.tuning.lr_finder import find_learning_rate
    from core.tuning.result import LRFinderResult

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
    "PerformanceOptimizer",
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

# What a run does not use loads when first asked for: the founding facades' extras, the
# console, trackers, reports, tuning, experts, memory tools, metrics, losses, data helpers.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Accuracy": "core.metrics.classification",
        "CSVLogger": "core.trackers.csv",
        "CachedDataset": "core.data.cache",
        "DevicePrefetcher": "core.data.prefetch",
        "ExpertGroup": "core.moe.experts",
        "F1Score": "core.metrics.classification",
        "FocalLoss": "core.losses.focal",
        "GPUConfig": "core.facades.gpu_utilization_mixed_precision_system",
        "GPUMemoryOptimizer": "core.memory.optimizer",
        "GPUPerformanceMonitor": "core.facades.gpu_utilization_mixed_precision_system",
        "GradientAccumulation": "core.facades.gradient_accumulation",
        "IntegratedGPUTrainingSystem": "core.facades.gpu_utilization_mixed_precision_system",
        "LRFinderResult": "core.tuning.result",
        "MLflowLogger": "core.trackers.mlflow",
        "MeanAbsoluteError": "core.metrics.regression",
        "MeanOf": "core.metrics.base",
        "Metric": "core.metrics.base",
        "MixedPrecisionOptimizer": "core.facades.mixed_precision_training",
        "MixedPrecisionTrainer": "core.facades.mixed_precision_training",
        "Mixup": "core.losses.mixup",
        "MixupCollate": "core.losses.mixup",
        "MoELayer": "core.moe.layer",
        "MultiGPUTrainer": "core.facades.multi_gpu_training",
        "PerformanceOptimizer": "core.facades.performance_optimizer",
        "Perplexity": "core.metrics.language",
        "ProgressBar": "core.console.progress",
        "TensorBoardLogger": "core.trackers.tensorboard",
        "Tracker": "core.trackers.base",
        "TrackerUnavailableError": "core.trackers.base",
        "WandbLogger": "core.trackers.wandb",
        "auxiliary_loss": "core.moe.probe",
        "create_dataloader": "core.data.loader",
        "create_mixed_precision_optimizer": "core.facades.mixed_precision_training",
        "create_mixed_precision_trainer": "core.facades.mixed_precision_training",
        "find_learning_rate": "core.tuning.lr_finder",
        "optimize_batch_size": "core.memory.finder",
        "optimize_model_memory": "core.memory.optimizer",
        "profile_memory_usage": "core.memory.profile",
        "summarize_model": "core.console.model_summary",
        "wait_for_reports": "core.reports.apart",
        "write_reports": "core.reports",
    },
)

set_aside_import_heap()  # last: torch and what a run uses are loaded (see core.hardware.heap)

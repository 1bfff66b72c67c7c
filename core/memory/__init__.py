"""Memory: measuring a training step's peak, finding the largest batch size that fits a
target, profiling where the memory goes, and ``GPUMemoryOptimizer``, one object over those
tools."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from core.memory.batches import (
        BatchMaker,
        batch_maker_for_shape,
        batch_maker_from,
        check_input_shape,
    )
    from core.memory.config import MemoryConfig
    from core.memory.finder import MAX_TRIALS, BatchSizeSearch, find_batch_size, optimize_batch_size
    from core.memory.meter import (
        CpuMemoryMeter,
        CudaMemoryMeter,
        MemoryMeter,
        MemoryReading,
        meter_for,
    )
    from core.memory.optimizer import GPUMemoryOptimizer, MemoryOptimization, optimize_model_memory
    from core.memory.profile import MemoryProfile, default_batch_sizes, profile_memory_usage
    from core.memory.trial import Trial, preserved, prime_optimizer, run_trial

__all__ = (
    "BatchMaker",
    "BatchSizeSearch",
    "CpuMemoryMeter",
    "CudaMemoryMeter",
    "GPUMemoryOptimizer",
    "MAX_TRIALS",
    "MemoryConfig",
    "MemoryMeter",
    "MemoryOptimization",
    "MemoryProfile",
    "MemoryReading",
    "Trial",
    "batch_maker_for_shape",
    "batch_maker_from",
    "check_input_shape",
    "default_batch_sizes",
    "find_batch_size",
    "meter_for",
    "optimize_batch_size",
    "optimize_model_memory",
    "preserved",
    "prime_optimizer",
    "profile_memory_usage",
    "run_trial",
)

# Each name's module loads when first asked for: importing one module of this package
# (a run imports a few) loads none of the others.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BatchMaker": "core.memory.batches",
        "BatchSizeSearch": "core.memory.finder",
        "CpuMemoryMeter": "core.memory.meter",
        "CudaMemoryMeter": "core.memory.meter",
        "GPUMemoryOptimizer": "core.memory.optimizer",
        "MAX_TRIALS": "core.memory.finder",
        "MemoryConfig": "core.memory.config",
        "MemoryMeter": "core.memory.meter",
        "MemoryOptimization": "core.memory.optimizer",
        "MemoryProfile": "core.memory.profile",
        "MemoryReading": "core.memory.meter",
        "Trial": "core.memory.trial",
        "batch_maker_for_shape": "core.memory.batches",
        "batch_maker_from": "core.memory.batches",
        "check_input_shape": "core.memory.batches",
        "default_batch_sizes": "core.memory.profile",
        "find_batch_size": "core.memory.finder",
        "meter_for": "core.memory.meter",
        "optimize_batch_size": "core.memory.finder",
        "optimize_model_memory": "core.memory.optimizer",
        "preserved": "core.memory.trial",
        "prime_optimizer": "core.memory.trial",
        "profile_memory_usage": "core.memory.profile",
        "run_trial": "core.memory.trial",
    },
)

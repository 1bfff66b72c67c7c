"""Memory: measuring a training step's peak, finding the largest batch size that fits a
target, profiling where the memory goes, and ``GPUMemoryOptimizer``, one object over those
tools."""

from __future__ import annotations

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

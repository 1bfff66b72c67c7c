"""Seed 000's ``setup_training``: the model made ready for its device and the largest batch
size whose training step fits there, in the precision the run will use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from core.config import TrainingConfig
from core.facades.integrated.manager import GPUManager
from core.memory.finder import find_batch_size
from core.precision.policy import resolve_precision

__all__ = ("setup_training",)


def setup_training(
    manager: GPUManager, model: nn.Module, input_shape: Sequence[int], config: TrainingConfig
) -> dict[str, Any]:
    """Optimize ``model`` for ``manager``'s device (in place) and search its batch size
    (:func:`~core.memory.find_batch_size` from ``input_shape[0]``, under ``config.memory``)
    in the precision the run will use. Weights and RNG are as before the search."""
    model = manager.optimize_model_for_gpu(model)
    precision = resolve_precision(config.precision, manager.device)
    memory = config.memory
    search = find_batch_size(
        model,
        input_shape,
        memory.target_memory_gb,
        memory.max_batch_size,
        memory.margin,
        autocast=precision.autocast,
        device=manager.device,
    )
    return {
        "optimal_batch_size": search.batch_size,
        "device": str(manager.device),
        "precision": precision.name,
        "gpu_info": manager.get_gpu_info(),
        "memory_usage": manager.get_memory_usage(),
        "model_optimization": manager.last_optimization,
        "batch_size_search": search.to_dict(),
    }

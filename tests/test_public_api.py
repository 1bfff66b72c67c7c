"""The public names: every seed module path keeps its names, and every module's ``__all__``
is a sorted tuple of names that exist."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import core

SEED_FACES = {
    "core.optimized_training_optimizer": (
        "OptimizedTrainingOptimizer", "create_optimized_training_optimizer",
    ),
    "core.mixed_precision_training": (
        "MixedPrecisionConfig", "MixedPrecisionOptimizer", "MixedPrecisionTrainer",
        "check_amp_compatibility", "create_mixed_precision_optimizer",
        "create_mixed_precision_trainer",
    ),
    "core.gpu_utilization_mixed_precision_system": (
        "GPUConfig", "GPUManager", "GPUMemoryOptimizer", "GPUPerformanceMonitor",
        "IntegratedGPUTrainingSystem", "MixedPrecisionConfig", "MixedPrecisionTrainer",
    ),
    "gpu_utilization_mixed_precision_system": (
        "GPUConfig", "GPUManager", "GPUMemoryOptimizer", "GPUPerformanceMonitor",
        "IntegratedGPUTrainingSystem", "MixedPrecisionConfig", "MixedPrecisionTrainer",
    ),
    "core.gradient_accumulation": ("GradientAccumulation", "GradientAccumulationConfig"),
    "core.multi_gpu_training": (
        "MultiGPUConfig", "MultiGPUTrainer", "create_multi_gpu_trainer", "get_free_port",
        "launch_distributed_training", "optimize_model_for_multi_gpu",
        "setup_distributed_environment",
    ),
}  # fmt: skip
MODULES = sorted(m.name for m in pkgutil.walk_packages(core.__path__, "core."))


@pytest.mark.parametrize(("path", "names"), sorted(SEED_FACES.items()))
def test_every_seed_path_keeps_its_names(path: str, names: tuple[str, ...]) -> None:
    module = importlib.import_module(path)
    assert set(names) <= set(module.__all__)
    for name in names:
        assert getattr(module, name) is getattr(core, name, getattr(module, name))


def test_the_package_exports_the_config_tree_and_the_seed_names() -> None:
    for name in ("TrainingConfig", "RunConfig", "LossScalerConfig", "Callback",
                 "OptimizedTrainingOptimizer", "create_optimized_training_optimizer"):  # fmt: skip
        assert name in core.__all__


@pytest.mark.parametrize("path", [*MODULES, "core"])
def test_all_is_a_sorted_tuple_of_existing_names(path: str) -> None:
    module = importlib.import_module(path)
    exported = getattr(module, "__all__", ())
    assert isinstance(exported, tuple), f"{path}.__all__ is not a tuple"
    assert list(exported) == sorted(exported), f"{path}.__all__ is not sorted"
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == []

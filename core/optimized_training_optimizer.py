"""The import path seeds 002 and 004 name:
the names of :mod:`core.facades.optimized_training_optimizer`, re-exported.

Example::

    from core.optimized_training_optimizer import create_optimized_training_optimizer
"""

from __future__ import annotations

from core.facades.optimized_training_optimizer import (
    OptimizedTrainingOptimizer,
    create_optimized_training_optimizer,
)

__all__ = (
    "OptimizedTrainingOptimizer",
    "create_optimized_training_optimizer",
)

"""The import path seeds 000 and 002 name:
the names of :mod:`core.facades.mixed_precision_training`, re-exported.

Example::

    from core.mixed_precision_training import create_mixed_precision_trainer
"""

from __future__ import annotations

from core.facades.mixed_precision_training import (
    LossScalerConfig,
    MixedPrecisionConfig,
    MixedPrecisionOptimizer,
    MixedPrecisionTrainer,
    check_amp_compatibility,
    create_mixed_precision_optimizer,
    create_mixed_precision_trainer,
)

__all__ = (
    "LossScalerConfig",
    "MixedPrecisionConfig",
    "MixedPrecisionOptimizer",
    "MixedPrecisionTrainer",
    "check_amp_compatibility",
    "create_mixed_precision_optimizer",
    "create_mixed_precision_trainer",
)

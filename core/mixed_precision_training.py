"""Seed face of mixed precision: the names seed 002 imports from here.

The implementation lives in ``core.precision``::

    from core.mixed_precision_training import MixedPrecisionConfig, MixedPrecisionTrainer

    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(dtype="bf16"), torch.device("cpu"))
"""

from __future__ import annotations

from core.precision.config import LossScalerConfig, MixedPrecisionConfig
from core.precision.policy import MixedPrecisionTrainer

__all__ = ("LossScalerConfig", "MixedPrecisionConfig", "MixedPrecisionTrainer")

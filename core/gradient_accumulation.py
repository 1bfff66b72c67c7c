"""The import path seed 002 names:
the names of :mod:`core.facades.gradient_accumulation`, re-exported.

Example::

    from core.gradient_accumulation import GradientAccumulationConfig
"""

from __future__ import annotations

from core.facades.gradient_accumulation import (
    GradientAccumulation,
    GradientAccumulationConfig,
)

__all__ = (
    "GradientAccumulation",
    "GradientAccumulationConfig",
)

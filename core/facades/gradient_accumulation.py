"""Seed face of gradient accumulation: the names seed 001 imports from here.

The implementation lives in ``core.loop.accumulation``::

    from core.gradient_accumulation import GradientAccumulation, GradientAccumulationConfig

    accumulation = GradientAccumulation(GradientAccumulationConfig(accumulation_steps=4))
"""

from __future__ import annotations

from core.loop.accumulation import GradientAccumulation, GradientAccumulationConfig

__all__ = ("GradientAccumulation", "GradientAccumulationConfig")

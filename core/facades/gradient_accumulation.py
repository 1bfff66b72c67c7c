"""The facade of gradient accumulation: the names seed 001 imports from here.
``GradientAccumulation`` is the step loop's :class:`~core.loop.accumulation.Accumulation`."""

from __future__ import annotations

from core.loop.accumulation import Accumulation, GradientAccumulationConfig

__all__ = ("GradientAccumulation", "GradientAccumulationConfig")

GradientAccumulation = Accumulation

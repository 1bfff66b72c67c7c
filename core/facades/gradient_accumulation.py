"""The facade of gradient accumulation: the names seed 001 imports from here.

The implementation is the step loop's :class:`~core.loop.accumulation.Accumulation`::

    from core.gradient_accumulation import GradientAccumulation, GradientAccumulationConfig

    accumulation = GradientAccumulation(GradientAccumulationConfig(accumulation_steps=4))
"""

from __future__ import annotations

from core.loop.accumulation import Accumulation, GradientAccumulationConfig

__all__ = ("GradientAccumulation", "GradientAccumulationConfig")


class GradientAccumulation(Accumulation):
    """Seed 001's name for the step loop's :class:`~core.loop.accumulation.Accumulation`:
    batches grouped into windows of ``accumulation_steps``, each split into micro-batches
    weighted by their share of the window. It adds nothing to it."""

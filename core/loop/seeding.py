"""Seeding every random number generator a training run touches: a re-export of
:func:`core.rng.seed_everything`, kept so that existing imports keep working.

Example::

    from core.loop.seeding import seed_everything
    seed_everything(0)
"""

from __future__ import annotations

from core.rng import seed_everything

__all__ = ("seed_everything",)

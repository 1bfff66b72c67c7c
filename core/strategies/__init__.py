"""Distribution strategies: one interface, one small class per way of running."""

from __future__ import annotations

from core.strategies.base import Strategy

__all__ = ("Strategy",)

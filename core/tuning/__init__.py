"""Tuning a run before it starts: the learning-rate range test."""

from __future__ import annotations

from core.tuning.config import LRFinderConfig
from core.tuning.lr_finder import find_learning_rate
from core.tuning.result import LRFinderResult

__all__ = ("LRFinderConfig", "LRFinderResult", "find_learning_rate")
